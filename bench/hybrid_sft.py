"""SFT tokens/s of a hybrid (Qwen3.5) beside a dense model on real-length medical conversations, one stage in this
process, Ray-free (issue 47 items 2, 3 and 5): the stage code the pipeline runs (stages.run_stage: build, train,
finish), planned by the planner for a --cap GiB card at the data's own lengths, with the linear-attention path this
process's kernel probe chose named in the plan. Used where Ray cannot travel with a GPU run (tilelang's wheels fill
its 64 MiB); the pipeline's own bench is real_length_throughput.py.

The data: bench/make_real_length_corpus.py's SFT mix (55 % short QA, 35 % consultations, 10 % long dialogues), the
model random-init weights of its shape (bench/family_models.prepare_model) with the tiny
preset's tokenizer. Measured from the stage's metrics.jsonl: tokens/s of every step (non-padding tokens), their
median after --warmup steps, all measured steps' tokens over their time, the peak allocated GiB against the plan.

    python3 bench/hybrid_sft.py --model qwen3.5-0.8b --packing auto --steps 12 --work /tmp/hs --out $OUT/a.json
    python3 bench/hybrid_sft.py --model-dir DIR --cap 0 ...     # a model directory as it is (CPU: a tiny one)
    python3 bench/hybrid_sft.py ... --profile 3    # + torch profiler over 3 optimizer steps after --warmup

--profile summarises where a step's time goes (the profiler slows the steps it records: their tokens/s are not the
benchmark's): the kernels by their GPU time, the ops by CPU time, and the GPU's busy share of the recorded wall.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def model_dir(name: str, work: Path) -> Path:
    from family_models import prepare_model  # a preset's shape, or a family model's

    from medgpt_ray.tiny import ensure_tiny

    return prepare_model(name, work / "models", ensure_tiny())


def prepared(work: Path, records: int) -> Any:
    from make_real_length_corpus import make_corpus

    from medgpt_ray.data.prepare import prepare_kind

    corpus = work / "corpus"
    if not (corpus / "sft.jsonl").is_file():
        make_corpus(corpus, records, 0)
    return prepare_kind("sft", [str(corpus / "sft.jsonl")], work / f"prepared-{records}", 0.01)


def plan_for(model: Path, cfg: Any, data: Any, cap: float) -> Any:
    from dataclasses import replace

    import torch

    from medgpt_ray.hybrid import kernels
    from medgpt_ray.memory.budget import make_budget
    from medgpt_ray.memory.planner import plan_stage
    from medgpt_ray.memory.shapes import load_shape
    from medgpt_ray.stages.length_profile import measure

    gpu = torch.cuda.is_available()
    budget = make_budget(cap if gpu and cap else None, 2.0 if gpu and cap else 0.0, "auto", gpu, f"bench cap {cap}",
                         detected_name=torch.cuda.get_device_name() if gpu else None)
    shape = load_shape(str(model))
    if gpu and shape.linear_layers:
        budget = replace(budget, linear_kernels=kernels.probe().as_dict())
    lengths = measure("sft", cfg, "chatml", model, data.train_file)
    return plan_stage("sft", cfg, 1, gpu, shape, budget, lengths), lengths


def steps_of(metrics: Path, warmup: int) -> dict[str, Any]:
    """Per-step tokens/s (StageProgress's metrics.jsonl: non-padding tokens), and over the steps after `warmup`:
    their median, and their tokens over their seconds."""
    steps = [r for r in (json.loads(x) for x in metrics.read_text().splitlines() if x.strip()) if "tokens_per_s" in r]
    times = [0.0] + [r["time_s"] for r in steps]
    seconds = [b - a for a, b in zip(times, times[1:], strict=False)]
    out: dict[str, Any] = {"steps": len(steps), "tokens_per_s": [round(r["tokens_per_s"]) for r in steps],
                           "step_seconds": [round(x, 2) for x in seconds],
                           "losses": [round(r["loss"], 4) for r in steps if "loss" in r]}
    measured = list(zip(steps, seconds, strict=True))[warmup:]
    if measured:
        out["median_after_warmup"] = round(statistics.median(r["tokens_per_s"] for r, _ in measured))
        secs = sum(dt for _, dt in measured)
        out["overall"] = round(sum(r["tokens_per_s"] * dt for r, dt in measured) / max(secs, 1e-9))
    return out


def startup_profiled(run: Any, top: int = 40) -> tuple[Any, dict[str, Any]]:
    """run() under cProfile from its start to its first optimizer step's end: where a stage's start-up goes (the
    imports its build triggers, the model's load, the data's encoding, the trainer's set-up, the first step's compile
    or cache load). The functions with the most cumulative seconds, `top` of them."""
    import cProfile
    import io
    import pstats

    from torch.optim.optimizer import register_optimizer_step_post_hook

    prof, t0 = cProfile.Profile(), time.monotonic()
    first: list[float] = []

    def stop(*_: Any) -> None:
        if not first:
            prof.disable()
            first.append(time.monotonic() - t0)

    hook = register_optimizer_step_post_hook(stop)
    prof.enable()
    try:
        result = run()
    finally:
        prof.disable()
        hook.remove()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(top)
    return result, {"first_step_s": round(first[0], 2) if first else None,
                    "by_cumulative_time": text.getvalue().split("\n")}


def profiled(run: Any, warmup: int, active: int) -> tuple[Any, dict[str, Any]]:
    """run() under torch's profiler, recording `active` optimizer steps after `warmup` (an optimizer step hook
    advances the profiler's schedule: the stage's Trainer loop is not ours to instrument)."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.profiler import ProfilerActivity, profile, schedule

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    windows: list[float] = []
    plan = schedule(wait=max(warmup - 1, 0), warmup=1, active=active, repeat=1)
    with profile(activities=acts, schedule=plan) as prof:
        def step(*_: Any) -> None:
            windows.append(time.monotonic())
            prof.step()
        hook = register_optimizer_step_post_hook(step)
        try:
            result = run()
        finally:
            hook.remove()
    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events)
    start = max(warmup, 1)
    wall_s = windows[start + active - 1] - windows[start - 1] if len(windows) >= start + active else None
    return result, {
        "steps_recorded": active,
        "wall_s": round(wall_s, 3) if wall_s else None,
        "gpu_busy_s": round(gpu_us / 1e6, 3),
        "gpu_busy_share": round(gpu_us / 1e6 / wall_s, 3) if wall_s else None,
        "by_gpu_time": events.table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=70),
        "by_cpu_time": events.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=70)}


def step_lines() -> None:
    """A line on stderr at every optimizer step's end (the stage's own progress is in metrics.jsonl, which a GPU call
    cut short does not bring back): how far a slow run got, and each step's seconds."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    t0 = last = time.monotonic()
    count = 0

    def line(*_: Any) -> None:
        nonlocal last, count
        now, count = time.monotonic(), count + 1
        print(f"[step {count}] {now - t0:.1f} s since start, {now - last:.2f} s this step", file=sys.stderr,
              flush=True)
        last = now

    register_optimizer_step_post_hook(line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3.5-0.8b")
    ap.add_argument("--model-dir", type=Path, help="a model directory instead of --model's random weights")
    ap.add_argument("--packing", default="auto", choices=["auto", "by_length", "false"],
                    help="the stage's packing key (by_length: the padded-by-length layout a refused packing trains)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--records", type=int, default=3000)
    ap.add_argument("--effective-batch", type=int, default=16)
    ap.add_argument("--cap", type=float, default=24.0, help="GiB the CUDA allocator is capped at (0: none)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/hybrid_sft"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--profile", type=int, default=0, help="profile this many optimizer steps after --warmup")
    ap.add_argument("--stacks-every", type=float, default=0,
                    help="print every thread's stack each this many seconds (where a run with no step is stuck)")
    ap.add_argument("--compile", default="auto", choices=["auto", "true", "false"],
                    help="the stage's compile key (auto: eager for a hybrid, and below 50 steps)")
    args = ap.parse_args()
    import torch
    from memory_calibration import cap_allocator, single_process_env

    from medgpt_ray.config import LoraConfig, SFTStageConfig
    from medgpt_ray.memory.format import plan_line
    from medgpt_ray.stages import run_stage
    from medgpt_ray.stages.inputs import StageInputs

    single_process_env()
    step_lines()
    if args.stacks_every:
        faulthandler.dump_traceback_later(args.stacks_every, repeat=True)
    if torch.cuda.is_available() and args.cap:
        cap_allocator(args.cap)
    model = args.model_dir or model_dir(args.model, args.work)
    data = prepared(args.work, args.records)
    gpu = torch.cuda.is_available()
    cfg = SFTStageConfig(method="lora", lora=LoraConfig(rank=8, alpha=16, dropout=0.0), lr=1e-4, seq_len=2048,
                         precision="bf16" if gpu else "fp32", effective_batch=args.effective_batch,
                         max_steps=args.steps, logging_steps=1, save_steps=10**6, warmup_ratio=0.0,
                         packing=False if args.packing == "false" else args.packing,
                         compile={"auto": "auto", "true": True, "false": False}[args.compile])
    plan, lengths = plan_for(model, cfg, data, args.cap)
    print("plan:", plan_line(plan), flush=True)
    out = args.work / f"run-{model.name}-{args.packing}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.monotonic()
    inputs = StageInputs("sft", cfg, plan, str(model), "chatml", data.train_file, data.eval_file, str(out),
                         resume=False)
    profile = None
    if args.profile:
        result, profile = profiled(lambda: run_stage(inputs), args.warmup, args.profile)
    else:
        result = run_stage(inputs)
    doc = {"command": " ".join(sys.argv), "model": args.model_dir and str(args.model_dir) or args.model,
           "device": torch.cuda.get_device_name() if gpu else "cpu", "packing_setting": args.packing,
           "plan_line": plan_line(plan), "plan": plan.to_dict(), "lengths": lengths.describe() if lengths else None,
           "wall_s": round(time.monotonic() - t0, 1), "packing": result.get("packing"),
           "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if gpu else None,
           "predicted_peak_gib": plan.prediction.peak_gib if plan.prediction else None,
           # The profiled steps and the one after them (the profiler's stop) are not measured.
           **steps_of(out / "metrics.jsonl", args.warmup + (args.profile + 1 if args.profile else 0)),
           **({"profile": profile} if profile else {})}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps({k: v for k, v in doc.items() if k not in ("plan", "profile")}, indent=1, default=str))
    if profile:
        print(profile["by_gpu_time"], f"GPU busy {profile['gpu_busy_share']} of the recorded wall", sep="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
