"""Tokens/s of the pipeline's stages on real-length medical data, under a 24 GiB cap (issue 15, item 7).

Every configuration runs one stage through the pipeline exactly as `jobs/pipeline.py` runs it: run/pipeline's
Pipeline on a local Ray cluster (data prepared by data/prepare, the stage planned by memory/planner for
--gpu-mem-gib, placed, run by run/stage_runner.run_stage_on_ray in one Ray Train worker), from the shipped config
with only that stage enabled (so it starts from the base model), max_steps --steps and a log every step. The
data is bench/make_real_length_corpus.py's (its module docstring has the length distribution). Variants:

  planner      the shipped config's stage: every memory knob `auto`, the planner's choice for the cap; `compile`
               pinned to what the planner picks for the full run (it does not compile runs capped below 50 steps,
               and a benchmark of --steps must measure what a real run trains with)
  unpacked     (in --variants) the planner variant with `packing: false` (a stage with the key: sft, rm), planned
               and compiled as the planner picks for it: packed vs padded on the same data in one call
  field-knobs  (--field-knobs, or in --variants) what MedicalGPT users run on a 4090: micro-batch 1, every layer
               checkpointed, no compiled layers or fused kernels, unpacked (`packing: false` where the config has
               the key)

The model has random weights of a Qwen2.5 shape (family_models.prepare_model, with the tiny preset's tokenizer;
needs CUDA), of a Qwen3 / Qwen3.5 / Qwen3-MoE shape (bench/family_models.py), or is the tiny preset itself (`--model
tiny`, CPU). On a GPU every worker caps its CUDA allocator at --gpu-mem-gib (bench/capped_stage.py), the planner
plans for that card, and the OOM back-off is off: an OOM is a result. Measured per configuration, from the stage's
metrics.jsonl: tokens/s of every step (the pipeline's count: non-padding tokens), their median and min after the
first --warmup steps (a compile or a recompile shows as a slow step), all measured steps' tokens over their time
(`overall`, what the ratios use), tokens per step, the peak allocated GiB against the plan's prediction, the plan.
The JSON under --out is rewritten after every configuration (a timeout keeps what finished), with the command.

    # here (CPU, tiny model, about a minute):
    .venv/bin/python bench/real_length_throughput.py --model tiny --steps 2 --out /tmp/rlt
    # the GPU machine has torch and transformers but not ray, trl, peft, datasets, deepspeed, pydantic: carry the
    # wheelhouse with ray (`bash ../shared/gpu/make-wheelhouse.sh` -> .whl) and start the command with
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \\
      && export PYTHONPATH=/tmp/site:$PYTHONPATH TORCH_CUDA_ARCH_LIST=9.0
    python3 bench/real_length_throughput.py --model qwen2.5-1.5b --stages pt,sft,rm,dpo --steps 10 --out $OUT
    python3 bench/real_length_throughput.py --model qwen2.5-1.5b --stages rm --variants planner,unpacked --out $OUT
    (the script puts the repository and bench/ on its own and its Ray workers' path; nothing else to install)
    (bench/README.md has the command lines of the issue's runs.)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT), str(BENCH)]

import capped_stage  # noqa: E402
import family_models  # noqa: E402
import make_real_length_corpus as corpus_gen  # noqa: E402

CONFIGS = {"tiny": ROOT / "configs" / "tiny-cpu.yaml", "gpu": ROOT / "configs" / "qwen2.5-7b-4x4090.yaml"}
FIELD_KNOBS = {"micro_batch": 1, "grad_ckpt": True, "compile": False, "fused_kernels": False}
RESULTS = "real_length_throughput.json"
VARIANTS = ("planner", "unpacked", "field-knobs")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", choices=["tiny", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b",
                                                        *family_models.FAMILY_MODELS])
    ap.add_argument("--stages", default="sft", help="comma-separated, in order: pt,sft,rm,dpo,orpo,simpo,kto")
    ap.add_argument("--variants", default="planner", help="comma-separated, run in this order per stage: "
                                                          "planner,unpacked,field-knobs")
    ap.add_argument("--field-knobs", action="store_true", help="add the field-knobs run after each planner run")
    ap.add_argument("--config", help="pipeline YAML (default: configs/tiny-cpu.yaml for tiny, else "
                                     "configs/qwen2.5-7b-4x4090.yaml)")
    ap.add_argument("--gpu-mem-gib", type=float, default=24.0, help="the card planned for and capped at (GPU)")
    ap.add_argument("--gpu-type", default="detected",
                    help="resources.gpu_type the planner ranks speed by (default: the GPU it runs on, whose compute "
                         "the cap leaves alone; 'auto' plans for the RTX 4090 the capped memory stands for)")
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per configuration")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the median and min")
    ap.add_argument("--effective-batch", type=int, help="examples per step (default: the config's, per stage)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="more config overrides for every configuration (repeatable)")
    ap.add_argument("--sft-records", type=int, default=4000)
    ap.add_argument("--pref-records", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="/tmp/medgpt-rlt")
    ap.add_argument("--out", required=True, help=f"directory for {RESULTS}")
    ap.add_argument("--verbose", action="store_true", help="the workers' output and Ray's log lines here")
    a = ap.parse_args(argv)
    a.stages = [s for s in a.stages.split(",") if s]
    a.variants = [v for v in a.variants.split(",") if v] + (["field-knobs"] if a.field_knobs else [])
    if not set(a.variants) <= set(VARIANTS):
        ap.error(f"--variants: {', '.join(VARIANTS)}, not {a.variants}")
    a.config = a.config or str(CONFIGS["tiny" if a.model == "tiny" else "gpu"])
    return a


# --- configuration ---------------------------------------------------------------------------------------------


def base_sets(a: argparse.Namespace, stage: str, name: str, model: str, data: dict[str, str],
              use_gpu: bool) -> list[str]:
    """The shipped config made a one-stage, one-worker benchmark run on the corpus (the variant not yet)."""
    from medgpt_ray.config import STAGE_KINDS, DataConfig, stage_kind
    from medgpt_ray.data.kinds import ALSO_READ_AS

    data_kind = stage_kind(stage).data_kind
    # kto's unpaired examples are the corpus's preference pairs, unpaired as the pipeline reads them
    read = {k for k in (data_kind, *ALSO_READ_AS.get(data_kind, ())) if k in data}
    sets = [f"name={name}", f"output_dir={Path(a.workdir) / 'runs'}", f"model.path={model}", "model.shape=null",
            "resources.num_workers=1", f"resources.use_gpu={str(use_gpu).lower()}", "resources.oom_backoff=false",
            "resources.worker_restarts=0", "resources.storage_path=null", "data.raw=[]", "data.eval_fraction=0.01"]
    if use_gpu:
        sets.append(f"resources.gpu_memory_gib={a.gpu_mem_gib}")
        sets.append(f"resources.gpu_type={planned_gpu_type(a.gpu_type)}")
    sets += [f"data.{k}=[{data[k]}]" if k in read else f"data.{k}=[]"
             for k in ("pretrain", "sft", "preference", "prompt", "unpaired") if k in DataConfig.model_fields]
    sets += [f"stages.{s}.enabled={str(s == stage).lower()}" for s in STAGE_KINDS]
    sets += [f"stages.{stage}.{k}={v}" for k, v in (("max_steps", a.steps), ("logging_steps", 1),
                                                     ("save_steps", 10**6))]
    if a.effective_batch:
        sets.append(f"stages.{stage}.effective_batch={a.effective_batch}")
    return sets + a.sets


def planned_gpu_type(choice: str) -> str:
    """The card the planner ranks speed by: the capped GPU's own compute unless told otherwise. The cap emulates a
    24 GiB card's memory, not its speed; planned for an RTX 4090's compute, the H200 runs the configuration that
    is fastest on a 4090 (RM: mb 4x4 at 21,797 tokens/s against mb 16x1 at 33,973 on the same data)."""
    if choice != "detected":
        return choice
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "auto"


def variant_sets(a: argparse.Namespace, stage: str, variant: str, sets: list[str]) -> tuple[list[str], dict]:
    """The variant's own overrides, and what they pinned (for the JSON)."""
    from medgpt_ray.config import load_config, stage_kind
    from medgpt_ray.memory.planner import plan_all

    has_packing = "packing" in stage_kind(stage).config_class.model_fields
    if variant == "unpacked" and not has_packing:
        raise SystemExit(f"--variants unpacked: stage {stage} has no `packing` key")
    knobs: dict[str, Any] = {"packing": False} if variant != "planner" and has_packing else {}
    if variant == "field-knobs":
        knobs.update(FIELD_KNOBS)
    else:
        # The planner's compile choice for the full run: the same config (and packing) less max_steps.
        pinned = [f"stages.{stage}.{k}={str(v).lower()}" for k, v in knobs.items()]
        full = load_config(a.config, [s for s in sets if not s.startswith(f"stages.{stage}.max_steps=")] + pinned)
        plans, _ = plan_all(full)  # a stage that cannot be planned fails in the run, with the reason
        knobs.update({"compile": plans[stage].compile} if stage in plans else {})
    return sets + [f"stages.{stage}.{k}={str(v).lower()}" for k, v in knobs.items()], knobs


def bench_pipeline():
    """run/pipeline's Pipeline, whose stage inputs name bench/capped_stage.py as the stage module (on CPU too, so
    the CPU run proves the workers import it; it caps only with CUDA and the cap's variable set)."""
    from dataclasses import replace

    from medgpt_ray.run.pipeline import Pipeline

    class BenchPipeline(Pipeline):
        def _inputs(self, *args: Any, **kwargs: Any):
            return replace(super()._inputs(*args, **kwargs), module=capped_stage.__name__)

    return BenchPipeline


# --- measurement -----------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def step_records(metrics_file: Path) -> list[dict[str, Any]]:
    """One record per optimizer step that logged a loss (logging_steps 1), with its tokens when the Trainer
    counted them."""
    if not metrics_file.is_file():
        return []
    logs = [json.loads(line) for line in metrics_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    steps, seen = [], 0
    for r in logs:
        if "loss" not in r or "tokens_per_s" not in r:
            continue
        rec = {k: r[k] for k in ("step", "tokens_per_s", "time_s", "gpu_peak_gib", "loss", "recompiles") if k in r}
        if "num_input_tokens_seen" in r:
            rec["tokens"] = int(r["num_input_tokens_seen"]) - seen
            seen = int(r["num_input_tokens_seen"])
        rec["tokens_per_s"] = round(rec["tokens_per_s"], 1)
        steps.append(rec)
    return steps


def throughput(steps: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    after = [s["tokens_per_s"] for s in steps if s["step"] > warmup]
    out: dict[str, Any] = {"warmup_steps": warmup, "steps_measured": len(after)}
    if after:
        med = statistics.median(after)
        out.update({"median": round(med, 1), "min": round(min(after), 1),
                    "min_over_median": round(min(after) / med, 3) if med else None})
    tokens = [s["tokens"] for s in steps if "tokens" in s and s["step"] > warmup]
    if tokens:
        out["tokens_per_step_median"] = statistics.median(tokens)
    overall = tokens_over_time(steps, warmup)
    if overall:
        out["overall"] = overall
    return out


def tokens_over_time(steps: list[dict[str, Any]], warmup: int) -> float | None:
    """All measured steps' tokens over their wall time. The ratios use it: with length-grouped steps the median
    step is a short one, and a short unpacked step is mostly fixed per-micro-batch cost (the field knobs' median
    step says 90 tokens/s where the run trains 172)."""
    timed = [s for s in steps if "tokens" in s and "time_s" in s]
    pairs = [(b["tokens"], b["time_s"] - a["time_s"]) for a, b in zip(timed, timed[1:], strict=False)
             if b["step"] > warmup and b["step"] == a["step"] + 1]
    seconds = sum(t for _, t in pairs)
    return round(sum(n for n, _ in pairs) / seconds, 1) if pairs and seconds > 0 else None


def collect(stage_dir: Path, warmup: int) -> dict[str, Any]:
    """What one configuration's stage directory says: the plan, the steps, tokens/s, predicted vs measured peak."""
    plan = _read_json(stage_dir / "plan.json") or {}
    plan.pop("alternatives", None)  # the rejected candidates: long, and in the run's plan.json
    steps = step_records(stage_dir / "metrics.jsonl")
    pred = plan.get("prediction") or {}
    peaks = [s["gpu_peak_gib"] for s in steps if "gpu_peak_gib" in s]
    measured = max(peaks) if peaks else None
    out = {"tokens_per_s": throughput(steps, warmup), "predicted_peak_gib": pred.get("peak_gib"),
           "measured_peak_gib": measured, "predicted_tokens_per_s": pred.get("tokens_per_s_per_gpu"),
           "per_step": steps, "plan": plan}
    if measured and pred.get("peak_gib"):
        out["peak_over_prediction_pct"] = round(100 * (measured - pred["peak_gib"]) / pred["peak_gib"], 2)
    result = _read_json(stage_dir / "result.json")
    if result:
        out["result"] = {k: v for k, v in result.items() if isinstance(v, int | float | str) or v is None
                         or k == "startup_s"}  # the start-up marks (issue 48: where a first step's seconds go)
    return out


def drop_models(stage_dir: Path) -> None:
    """The stage's model, adapter and checkpoints: a 7B run writes a merged 15 GB model, the machine has 64 GB."""
    if stage_dir.is_dir():
        for child in stage_dir.iterdir():
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)


def run_config(a: argparse.Namespace, stage: str, variant: str, model: str, data: dict[str, str],
               use_gpu: bool) -> dict[str, Any]:
    from medgpt_ray.config import load_config
    from medgpt_ray.run.pipeline import RunOptions

    name = f"{a.model}-{stage}-{variant}"
    sets, pinned = variant_sets(a, stage, variant, base_sets(a, stage, name, model, data, use_gpu))
    out: dict[str, Any] = {"name": name, "model": a.model, "stage": stage, "variant": variant, "pinned": pinned,
                           "sets": sets}
    t0 = time.monotonic()
    try:
        cfg = load_config(a.config, sets)
        out["effective_batch"] = cfg.stages.get(stage).effective_batch
        out["seq_len"] = cfg.stages.get(stage).seq_len
        pipeline = bench_pipeline()(cfg, RunOptions(), "local")
        shutil.rmtree(pipeline.run_dir, ignore_errors=True)  # a fresh run, never a resumed or skipped one
        pipeline.run()
        out["status"] = "ok"
    except Exception as e:  # a failed configuration (OOM, plan refused) is a result; the next one still runs
        out.update(status="failed", error=f"{type(e).__name__}: {e}"[-3000:])
    out["wall_s"] = round(time.monotonic() - t0, 1)
    stage_dir = Path(a.workdir) / "runs" / name / stage
    out.update(collect(stage_dir, min(a.warmup, a.steps - 1)))  # --steps 2: one step measured
    drop_models(stage_dir)
    return out


# --- driver ----------------------------------------------------------------------------------------------------


def ratios(results: list[dict[str, Any]]) -> dict[str, float]:
    """SFT against PT, and the planner against the unpacked and field-knobs variants, by tokens over time (else
    median tokens/s)."""
    med = {(r["stage"], r["variant"]): r["tokens_per_s"].get("overall") or r["tokens_per_s"].get("median")
           for r in results}
    out = {}
    if med.get(("sft", "planner")) and med.get(("pt", "planner")):
        out["sft_over_pt"] = round(med[("sft", "planner")] / med[("pt", "planner")], 3)
    for (stage, variant), v in med.items():
        for other in ("unpacked", "field-knobs"):
            base = med.get((stage, other))
            if variant == "planner" and v and base:
                out[f"{stage}_planner_over_{other.replace('-', '_')}"] = round(v / base, 2)
    return out


def environment(use_gpu: bool) -> dict[str, Any]:
    import torch

    versions = {}
    for m in ("torch", "transformers", "trl", "peft", "ray", "deepspeed", "liger-kernel"):
        try:
            versions[m] = version(m)
        except PackageNotFoundError:
            versions[m] = None
    device = torch.cuda.get_device_name(0) if use_gpu else f"cpu ({os.cpu_count()} cores)"
    return {"device": device, "versions": versions}


def line(r: dict[str, Any]) -> str:
    t = r["tokens_per_s"]
    return (f"{r['name']}: {r['status']} median {t.get('median', 0):,.0f} tokens/s, min {t.get('min', 0):,.0f} "
            f"({t.get('steps_measured')} steps), peak {r.get('measured_peak_gib')} GiB "
            f"(predicted {r.get('predicted_peak_gib')}), plan mb {r['plan'].get('micro_batch')} x accum "
            f"{r['plan'].get('grad_accum')} ckpt {r['plan'].get('ckpt_fraction')} compile {r['plan'].get('compile')}")


def prepare(a: argparse.Namespace, use_gpu: bool) -> tuple[str, dict[str, Any]]:
    """The model (path or preset) and the corpus, with its measured distribution in the model's tokens."""
    from medgpt_ray.tiny import ensure_tiny

    tokenizer = ensure_tiny()
    if a.model == "tiny":
        model, tok_dir = "tiny", tokenizer
    else:
        if not use_gpu:
            raise SystemExit(f"--model {a.model} builds its random-init weights on CUDA; here only --model tiny")
        models = Path(a.workdir) / "models"
        model = str(family_models.prepare_model(a.model, models, tokenizer))  # a preset's shape or a family's
        tok_dir = Path(model)
    where = Path(a.workdir) / f"corpus-{a.sft_records}-{a.pref_records}-{a.seed}"
    cached = where / "summary.json"  # the generator is deterministic: one made earlier with this tokenizer is it
    if cached.is_file() and json.loads(cached.read_text())["tokenizer"] == str(tok_dir):
        return model, json.loads(cached.read_text())
    corpus = corpus_gen.make_corpus(where, a.sft_records, a.pref_records, a.seed, str(tok_dir))
    cached.write_text(json.dumps(corpus, ensure_ascii=False, indent=1), encoding="utf-8")
    return model, corpus


def start_bench_ray(a: argparse.Namespace, use_gpu: bool) -> None:
    """The local Ray cluster the benchmark's pipeline runs on, its workers capped at --gpu-mem-gib (GPU)."""
    from medgpt_ray.run.ray_env import connect_ray

    if use_gpu:
        os.environ[capped_stage.CAP_ENV] = str(a.gpu_mem_gib)  # forwarded to the workers (MEDGPT_RAY_*)
    # The workers import bench/capped_stage.py: they inherit this environment from the local Ray cluster.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    connect_ray(log_file=Path(a.workdir) / "ray.log", verbose=a.verbose, worker_logs=a.verbose)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch


    use_gpu = torch.cuda.is_available()
    t0 = time.monotonic()
    model, corpus = prepare(a, use_gpu)
    print(f"[{time.monotonic() - t0:6.1f}s] corpus ({corpus['measured']['unit']}): "
          f"{json.dumps(corpus['measured']['sft'])}", flush=True)
    start_bench_ray(a, use_gpu)
    doc: dict[str, Any] = {"command": shlex.join(["python", *sys.argv]), **environment(use_gpu),
                           "gpu_mem_gib": a.gpu_mem_gib if use_gpu else None, "config": a.config,
                           "steps": a.steps, "warmup": a.warmup, "corpus": corpus, "runs": []}
    out = Path(a.out) / RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    for stage in a.stages:
        for variant in dict.fromkeys(a.variants):
            r = run_config(a, stage, variant, model, corpus["files"], use_gpu)
            doc["runs"].append(r)
            doc["ratios"] = ratios(doc["runs"])
            out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            print(f"[{time.monotonic() - t0:6.1f}s] {line(r)}", flush=True)
    print(json.dumps({"ratios": doc["ratios"], "out": str(out)}), flush=True)
    return 0 if all(r["status"] == "ok" for r in doc["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
