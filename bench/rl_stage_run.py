"""GRPO and RLOO on a Qwen2.5 shape, through the pipeline, under a 24 GiB cap (issue 18: "on the GPU machine the
1.5B-shape grpo and rloo stages run through the pipeline with measured peak <= planned").

One pipeline run, exactly as `jobs/pipeline.py` runs it (run/pipeline's Pipeline on local Ray, every stage planned
for --gpu-mem-gib and placed, one worker): sft and rm for --train-steps optimizer steps each (they only make the
models the RL stages start from and are rewarded by), then grpo (from sft; rewards accuracy + length) and rloo (from
sft, rewarded by the rm stage's model) for --steps steps each. The model is random-init weights of the shape
(bench/memory_calibration.prepare_model) with the tiny preset's tokenizer; the data is
bench/make_real_length_corpus.py's real-length corpus, and the prompts are its SFT records' first question with the
first answer as the reference ({"question", "answer"}: MedicalGPT's GRPO format), so their lengths are real ones
(QA of a few dozen tokens, consultations of a few hundred). Random weights rarely stop early: every completion runs
to max_completion_length, the worst case for the KV cache the planner sizes.

Measured per RL stage, from its metrics.jsonl and its worker: the plan (generation batch, micro-batch, predicted
peak), the worker's peak allocated GiB (capped_stage's bench_peak.json: generation included, which the per-step
gpu_peak_gib also covers), generations/s and generated tokens/s, training tokens/s, completion length, wall time.
The JSON under --out is written when the run ends, also when it is stopped (SIGTERM: `timeout` before the call's
limit), with what finished.

    # the GPU machine (the wheelhouse with ray etc. installed as in bench/real_length_throughput.py's docstring):
    timeout 560 python3 bench/rl_stage_run.py --model qwen2.5-1.5b --out $OUT
    # opd with a 7B NF4 teacher over a 1.5B student (issue 49 item 3; .whl + bench/make_bnb_wheel.sh's bitsandbytes):
    timeout 560 python3 bench/rl_stage_run.py --model qwen2.5-1.5b --stages opd --teacher qwen2.5-7b \
        --teacher-quantization 4bit --train-steps 0 --steps 20 --max-completion-length 128 --out $OUT
    # here (CPU, the tiny preset, a few minutes; opd: --stages opd, its teacher the sft stage):
    .venv/bin/python bench/rl_stage_run.py --model tiny --steps 2 --train-steps 2 --num-generations 4 \\
        --max-completion-length 16 --set stages.grpo.seq_len=256 --set stages.rloo.seq_len=256 --out /tmp/rsr
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT), str(BENCH)]

import capped_stage  # noqa: E402
import pipeline_bench  # noqa: E402
import real_length_throughput as rlt  # noqa: E402

RESULTS = "rl_stage_run.json"
TRAINED = ("sft", "rm")
RL = ("grpo", "rloo", "opd")
# opd's own keys (issue 49 item 3): the teacher a model directory (--teacher: a preset's random weights) or `sft`.
# What TRL logs per step that says how generation went, besides our generation counters (stages/online_rl.py).
RL_LOGS = ("reward", "reward_std", "kl", "completions/mean_length", "completions/max_length",
           "generation/generations_per_s", "generation/tokens_per_s", "tokens_per_s", "gpu_peak_gib", "time_s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    pipeline_bench.add_pipeline_run_args(ap, "/tmp/medgpt-rsr")
    ap.add_argument("--stages", default="grpo,rloo", help="the RL stages to run: grpo,rloo,opd")
    ap.add_argument("--teacher", help="opd's teacher: a preset's random weights (e.g. qwen2.5-7b); default: sft")
    ap.add_argument("--teacher-quantization", default="none", choices=["none", "4bit"])
    ap.add_argument("--lmbda", type=float, default=0.5, help="opd: the share of micro-batches the student answers")
    ap.add_argument("--opd-batch", type=int, default=8, help="opd: conversations per optimizer step")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps of each RL stage")
    ap.add_argument("--train-steps", type=int, default=2, help="optimizer steps of sft and rm (0: neither runs, "
                                                               "grpo starts from the base model; not with rloo)")
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-completion-length", type=int, default=256)
    ap.add_argument("--rl-seq-len", type=int, default=1024, help="the RL stages' seq_len (prompt + completion)")
    ap.add_argument("--prompts-per-step", type=int, default=4, help="effective_batch = this x --num-generations")
    ap.add_argument("--widest-prompts", type=int, help="keep only this many prompts, the longest: every step is "
                    "near the plan's worst case (it prices the split's widest prompt), so the peak tests the plan; "
                    "for opd, the longest SFT conversations (its prompts and reference answers)")
    a = pipeline_bench.pipeline_run_defaults(ap.parse_args(argv))
    a.rl = [s for s in a.stages.split(",") if s]
    if not a.rl or set(a.rl) - set(RL):
        ap.error(f"--stages: a subset of {','.join(RL)}, not {a.stages}")
    if a.train_steps == 0 and "rloo" in a.rl:
        ap.error("--train-steps 0: rloo needs the rm stage")
    if a.train_steps == 0 and "opd" in a.rl and not a.teacher:
        ap.error("--train-steps 0: opd's default teacher is the sft stage; name a --teacher")
    return a


def write_prompts(sft_file: str, out: Path, widest: int | None = None) -> int:
    """The corpus's SFT records as GRPO prompts: first question, first answer as the reference; with `widest`, only
    that many, the longest questions (in characters: the tokenizer's count follows them closely for Chinese)."""
    prompts = []
    with open(sft_file, encoding="utf-8") as src:
        for raw in src:
            turns = json.loads(raw)["conversations"]
            q = next((t["value"] for t in turns if t["from"] == "human"), None)
            ans = next((t["value"] for t in turns if t["from"] == "gpt"), None)
            if q and ans:
                prompts.append({"question": q, "answer": ans})
    if widest:
        prompts = sorted(prompts, key=lambda p: len(p["question"]), reverse=True)[:widest]
    with out.open("w", encoding="utf-8") as dst:
        dst.writelines(json.dumps(p, ensure_ascii=False) + "\n" for p in prompts)
    return len(prompts)


def write_widest_sft(sft_file: str, out: Path, widest: int) -> str:
    """The `widest` longest SFT records (in characters over their turns) as an SFT file: opd's rows are each a
    conversation up to its last answer, left-padded to the micro-batch's longest, so with these every micro-batch is
    as wide as the plan's seq_len (the width it prices)."""
    with open(sft_file, encoding="utf-8") as src:
        lines = [raw for raw in src if raw.strip()]
    size = {raw: sum(len(t.get("value", "")) for t in json.loads(raw)["conversations"]) for raw in lines}
    out.write_text("".join(sorted(lines, key=size.__getitem__, reverse=True)[:widest]), encoding="utf-8")
    return str(out)


def run_sets(a: argparse.Namespace, model: str, data: dict[str, str], prompts: Path, use_gpu: bool,
             teacher: str | None = None) -> list[str]:
    """real_length_throughput's one-stage sets made sft -> rm -> grpo / rloo, and opd (from the base model, its
    teacher the sft stage or `teacher`, a model directory)."""
    from medgpt_ray.config import STAGE_KINDS

    sets = [s for s in rlt.base_sets(a, "sft", "rl-run", model, data, use_gpu)
            if not s.startswith(("stages.", "data.preference=", "data.prompt="))]
    sets += [f"data.preference=[{data['preference']}]", f"data.prompt=[{prompts}]"]
    # --train-steps 0: grpo (or opd with a --teacher) from the base model, no rm; opd alone needs no reward model
    trained = (TRAINED if {"grpo", "rloo"} & set(a.rl) else ("sft",)) if a.train_steps else ()
    sets += [f"stages.{s}.enabled={str(s in (*trained, *a.rl)).lower()}" for s in STAGE_KINDS]
    for s in TRAINED:
        sets += [f"stages.{s}.max_steps={a.train_steps}", f"stages.{s}.logging_steps=1",
                 f"stages.{s}.save_steps=1000000"]
    for s in a.rl:
        sets += [f"stages.{s}.max_steps={a.steps}", f"stages.{s}.logging_steps=1", f"stages.{s}.save_steps=1000000"]
        if s == "opd":
            sets += [f"stages.opd.teacher={teacher or 'sft'}",
                     f"stages.opd.teacher_quantization={a.teacher_quantization}",
                     f"stages.opd.max_new_tokens={a.max_completion_length}", f"stages.opd.seq_len={a.rl_seq_len}",
                     f"stages.opd.lmbda={a.lmbda}", f"stages.opd.effective_batch={a.opd_batch}"]
            continue
        sets += [f"stages.{s}.num_generations={a.num_generations}",
                 f"stages.{s}.max_completion_length={a.max_completion_length}",
                 f"stages.{s}.seq_len={a.rl_seq_len}",
                 f"stages.{s}.effective_batch={a.prompts_per_step * a.num_generations}"]
    if "grpo" in a.rl:
        sets += ["stages.grpo.reward_funcs=[accuracy,length]"]
    return sets + a.sets


def rl_numbers(stage_dir: Path) -> dict[str, Any]:
    """One RL stage: its plan, predicted and measured peak, per-step generation and training numbers, medians."""
    plan = rlt._read_json(stage_dir / "plan.json") or {}
    plan.pop("alternatives", None)
    rows = []
    if (stage_dir / "metrics.jsonl").is_file():
        for line in (stage_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
            r = json.loads(line) if line.strip() else {}
            if "loss" in r:
                rows.append({"step": r.get("step"), **{k: r[k] for k in RL_LOGS if k in r}})
    medians = {k: round(statistics.median(r[k] for r in rows[1:] if k in r), 3)
               for k in RL_LOGS if k != "time_s" and sum(k in r for r in rows[1:])}
    worker_peak = (rlt._read_json(stage_dir / capped_stage.PEAK_FILE) or {}).get("max_allocated_gib")
    step_peaks = [r["gpu_peak_gib"] for r in rows if "gpu_peak_gib" in r]
    measured = max([p for p in (worker_peak, *step_peaks) if p is not None], default=None)
    pred = (plan.get("prediction") or {}).get("peak_gib")
    receipt = rlt._read_json(stage_dir / "result.json") or {}
    out = {"wall_s": receipt.get("wall_s"), "steps": len(rows), "predicted_peak_gib": pred,
           "measured_peak_gib": measured, "worker_peak_gib": worker_peak,
           "medians_after_first_step": medians, "per_step": rows, "plan": plan,
           "result": {k: v for k, v in receipt.items() if isinstance(v, int | float | str) or v is None
                      or k == "startup_s"},  # the start-up marks (issue 48)
           # the static path's: caches, calls, graphs compiled, cudagraph skips, attention, seconds in generate
           "decode": receipt.get("decode")}
    if measured and pred:
        out["peak_over_prediction_pct"] = round(100 * (measured - pred) / pred, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch

    from medgpt_ray.config import load_config

    # `timeout` sends SIGTERM: end like Ctrl-C, so what finished is still measured and written.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    use_gpu = torch.cuda.is_available()
    t0 = time.monotonic()
    model, corpus = rlt.prepare(a, use_gpu)
    prompts = Path(a.workdir) / "prompts.jsonl"
    n_prompts = write_prompts(corpus["files"]["sft"], prompts, a.widest_prompts)
    if a.widest_prompts and "opd" in a.rl:
        corpus["files"]["sft"] = write_widest_sft(corpus["files"]["sft"], Path(a.workdir) / "widest_sft.jsonl",
                                                  a.widest_prompts)
    teacher = None
    if a.teacher:  # random weights of the preset, the tiny tokenizer: the same vocabulary as the student's
        from memory_calibration import prepare_model

        from medgpt_ray.tiny import ensure_tiny

        teacher = str(prepare_model(a.teacher, Path(a.workdir) / "models", ensure_tiny()).resolve())
    rlt.start_bench_ray(a, use_gpu)
    sets = run_sets(a, model, corpus["files"], prompts, use_gpu, teacher)
    doc: dict[str, Any] = {"command": shlex.join(["python", *sys.argv]), **rlt.environment(use_gpu),
                           "gpu_mem_gib": a.gpu_mem_gib if use_gpu else None, "config": a.config, "sets": sets,
                           "prompts": n_prompts, "corpus_measured": corpus.get("measured")}
    cfg = load_config(a.config, sets)
    run_dir = pipeline_bench.run_fresh_pipeline(cfg, doc)
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    doc["stages"] = {s: rl_numbers(run_dir / s) for s in a.rl}
    out = Path(a.out) / RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    brief = {s: {k: v for k, v in d.items() if k not in ("per_step", "plan", "result")}
             for s, d in doc["stages"].items()}
    print(json.dumps({"status": doc["status"], "stages": brief, "out": str(out)}, indent=1), flush=True)
    return 0 if doc["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
