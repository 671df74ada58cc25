"""Batch generation on Ray Data: prompts from any file the readers know, generated in an actor pool (one model per
actor: a GPU each where the cluster has GPUs, else CPU), written as Parquet parts with each prompt's id.

OUT/ holds generate.json (the model, template and sampling settings), generations/part-*.parquet (one row per
sample: prompt_id, sample, response, prompt_tokens, new_tokens, finished), quarantine.jsonl (rows that are no
prompt: file, line, reason; never the text) and summary.json (decode_path: the path the actors decoded on and why,
generation/decode_path.py, also printed once the first batch is back). A part is renamed into place only once
written, so a run that stops keeps every finished part, and the next run with the same settings generates only the
prompts with no part yet. Prompts go out sorted by length, so a batch pads little."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import ray

from medgpt_ray.data.files import Quarantined
from medgpt_ray.data.prompt_rows import iter_prompts
from medgpt_ray.generation.engine import Generator
from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.infer.source import ModelSourceError, resolve_model
from medgpt_ray.progress import format_eta

PARTS = "generations"


@dataclass
class GenerateOptions:
    model: str
    inputs: list[str]
    out: Path
    params: GenerationParams = field(default_factory=GenerationParams)
    template: str | None = None
    batch_size: int = 16
    num_workers: int = 1
    gpus_per_worker: float | None = None  # None: 1 where the cluster has GPUs, else 0 (CPU)
    generation_path: str = "auto"  # the decode path (generation/decode_path.py); not an answer setting: greedy
    # answers are the same on both paths, so a re-run may change it


def _settings(opts: GenerateOptions) -> dict[str, Any]:
    source = resolve_model(opts.model, opts.template)
    return {"model": str(source.path.resolve()), "template": source.template, "params": opts.params.as_dict()}


def _check_settings(out: Path, settings: dict[str, Any]) -> None:
    """Parts already in OUT were made with generate.json's settings: other settings would mix two runs' answers."""
    path = out / "generate.json"
    if path.is_file():
        before = json.loads(path.read_text(encoding="utf-8"))
        changed = [k for k in ("model", "template") if before.get(k) != settings[k]]
        # As JSON holds them (tuples are lists there); a setting newer than the file is its default there.
        now = json.loads(json.dumps(settings["params"]))
        then = {**json.loads(json.dumps(GenerationParams().as_dict())), **before.get("params", {})}
        changed += [f"params.{k}" for k, v in now.items() if then.get(k) != v]
        if changed:
            raise ModelSourceError(f"{out}: its generations were made with other settings ({', '.join(changed)} "
                                   f"differ from {path}); use another --out, or remove {out / PARTS} to start over")
    path.write_text(json.dumps(settings, indent=1, ensure_ascii=False), encoding="utf-8")


def done_ids(out: Path) -> set[str]:
    """Prompt ids with a finished part (a prompt's samples are generated, and written, together)."""
    return {i for part in sorted((out / PARTS).glob("part-*.parquet"))
            for i in pq.read_table(part, columns=["prompt_id"]).column(0).to_pylist()}


def _load(inputs: list[str], out: Path) -> tuple[list[dict], int]:
    """The usable prompts (unique ids, first wins) and the number quarantined (written to quarantine.jsonl)."""
    prompts, seen, bad = [], set(), []
    for item in iter_prompts(inputs):
        if isinstance(item, Quarantined):
            bad.append({"file": item.file, "line": item.line, "reason": item.reason})
            continue
        pid, record = item
        if pid in seen:
            bad.append({"file": "", "line": 0, "reason": f"duplicate prompt id {pid!r}: the first one is kept"})
            continue
        seen.add(pid)
        prompts.append({"prompt_id": pid, "conversations": json.dumps(record["conversations"], ensure_ascii=False),
                        "tools": json.dumps(record.get("tools") or [], ensure_ascii=False)})
    with open(out / "quarantine.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(b, ensure_ascii=False) + "\n" for b in bad)
    return prompts, len(bad)


def _write_part(out: Path, n: int, table: pa.Table) -> None:
    final = out / PARTS / f"part-{n:05d}.parquet"
    tmp = final.with_suffix(".parquet.tmp")
    pq.write_table(table.drop_columns(["batch_seconds", "warmup", "decode_path"]), tmp)
    os.replace(tmp, final)


def _pool_resources(opts: GenerateOptions) -> dict[str, float]:
    gpus = opts.gpus_per_worker
    if gpus is None:
        gpus = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 and _cuda_visible() else 0.0
    return {"num_gpus": gpus, "num_cpus": 1.0}


def _cuda_visible() -> bool:
    """Logical GPUs a test cluster advertises are no CUDA devices: ask a one-GPU task whether it sees one."""
    @ray.remote(num_gpus=1, num_cpus=0)
    def probe() -> bool:
        import torch

        return torch.cuda.is_available()

    return bool(ray.get(probe.remote(), timeout=120))


def generate(opts: GenerateOptions, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Generate for every prompt of opts.inputs that has no part in opts.out yet; returns (and writes) the summary."""
    out = Path(opts.out)
    (out / PARTS).mkdir(parents=True, exist_ok=True)
    settings = _settings(opts)
    _check_settings(out, settings)
    prompts, quarantined = _load(opts.inputs, out)
    done = done_ids(out)
    pending = sorted((p for p in prompts if p["prompt_id"] not in done), key=lambda p: len(p["conversations"]))
    echo(f"[generate] {len(prompts)} prompts ({quarantined} quarantined: {out / 'quarantine.jsonl'}), "
         f"{len(prompts) - len(pending)} already generated, {len(pending)} to go")
    summary = {"prompts": len(prompts), "quarantined": quarantined, "already_done": len(prompts) - len(pending),
               "generated": 0, "samples": 0, "new_tokens": 0, "unfinished_samples": 0, "generate_seconds": 0.0,
               "warmup_seconds": 0.0, "warmup_new_tokens": 0, "decode_path": None, **settings}
    t0 = time.monotonic()
    if pending:
        _run(opts, settings, pending, summary, echo)
    summary["wall_s"] = round(time.monotonic() - t0, 2)
    summary["new_tokens_per_s"] = round(summary["new_tokens"] / summary["wall_s"], 1) if summary["wall_s"] else None
    # Inside the generate calls only (no actor start, no model load), per actor:
    gen = summary["generate_seconds"]
    summary["new_tokens_per_s_per_actor"] = round(summary["new_tokens"] / gen, 1) if gen else None
    # and without the calls that built a static cache (compiling the decode step, capturing its graphs: once a run)
    warm_s, warm_tokens = gen - summary["warmup_seconds"], summary["new_tokens"] - summary["warmup_new_tokens"]
    summary["warm_new_tokens_per_s_per_actor"] = (round(warm_tokens / warm_s, 1)
                                                  if warm_s > 0 and summary["warmup_seconds"] else None)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False), encoding="utf-8")
    echo(f"[generate] done: {summary['generated']} prompts, {summary['samples']} samples, {summary['new_tokens']:,} "
         f"new tokens in {summary['wall_s']:.1f}s ({summary['unfinished_samples']} stopped at --max-new-tokens); "
         f"outputs in {out / PARTS}")
    if summary["warm_new_tokens_per_s_per_actor"]:
        echo(f"[generate] {summary['warmup_seconds']:.1f}s of it built the static cache and compiled the decode step; "
             f"after that {summary['warm_new_tokens_per_s_per_actor']:,.0f} new tokens/s per actor")
    return summary


def _run(opts: GenerateOptions, settings: dict[str, Any], pending: list[dict], summary: dict[str, Any],
         echo: Callable[[str], None]) -> None:
    out = Path(opts.out)
    # After the highest part there is: a lost part leaves a gap, and numbering by count would overwrite a kept one.
    first_part = 1 + max((int(p.stem.split("-")[1]) for p in (out / PARTS).glob("part-*.parquet")), default=-1)
    resources = _pool_resources(opts)
    where = f"{opts.num_workers} GPU actor(s)" if resources["num_gpus"] else f"{opts.num_workers} CPU actor(s)"
    echo(f"[generate] model {settings['model']}, template {settings['template'] or 'the tokenizer own'}, {where}, "
         f"batches of {opts.batch_size}, generation path {opts.generation_path}"
         + (" (static on a GPU, dynamic on the CPU and for linear-attention models)"
            if opts.generation_path == "auto" else ""))
    # Ray prints one "constructor arguments in the object store" line per actor (ray-project/ray#53727): Ray Data's
    # own map worker has such arguments, with or without ours.
    ds = ray.data.from_items(pending).map_batches(
        Generator, fn_constructor_kwargs={"model_path": settings["model"], "template": settings["template"],
                                          "params": settings["params"], "generation_path": opts.generation_path},
        batch_size=opts.batch_size, compute=ray.data.ActorPoolStrategy(size=opts.num_workers), **resources)
    t0, last, paths = time.monotonic(), 0.0, set()
    for n, table in enumerate(ds.iter_batches(batch_size=None, batch_format="pyarrow")):
        _write_part(out, first_part + n, table)
        for path in sorted(set(table.column("decode_path").to_pylist()) - {"", *paths}):  # each actor's, once
            echo(f"[generate] decode path: {path}")
            paths.add(path)
            summary["decode_path"] = " | ".join(sorted(paths))
        summary["generated"] += len(set(table.column("prompt_id").to_pylist()))
        summary["samples"] += table.num_rows
        summary["new_tokens"] += sum(table.column("new_tokens").to_pylist())
        summary["unfinished_samples"] += table.num_rows - sum(table.column("finished").to_pylist())
        summary["generate_seconds"] += sum(table.column("batch_seconds").to_pylist())
        _count_warmup(table, summary)
        now = time.monotonic()
        if now - last >= 5 or summary["generated"] == len(pending):
            rate = summary["generated"] / (now - t0)
            per_actor = summary["new_tokens"] / summary["generate_seconds"] if summary["generate_seconds"] else 0
            echo(f"[generate] {summary['generated']}/{len(pending)} prompts, "
                 f"{summary['new_tokens'] / (now - t0):,.0f} new tokens/s ({per_actor:,.0f} per actor while "
                 f"generating), ETA {format_eta((len(pending) - summary['generated']) / rate if rate else None)}")
            last = now


def _count_warmup(table: pa.Table, summary: dict[str, Any]) -> None:
    """Add the seconds and new tokens of the batches in `table` whose call built a static cache to the summary's
    warm-up (every row of such a batch is flagged; its seconds are on its first row)."""
    for flag, n, s in zip(table.column("warmup").to_pylist(), table.column("new_tokens").to_pylist(),
                          table.column("batch_seconds").to_pylist(), strict=True):
        if flag:
            summary["warmup_seconds"] += s
            summary["warmup_new_tokens"] += n
