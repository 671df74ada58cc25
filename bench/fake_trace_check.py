"""fake_trace.py against the H200: each eager SFT run of bench/results/memory_calibration_h200.json (no Liger kernels,
no compiled layers, no DeepSpeed, no 4/8-bit; the runs fake_trace.py can set up as the stage did) traced on fake
tensors on this CPU at the same model shape, method, precision, micro-batch, seq_len (every row full length, as the
calibration's synthetic records are), checkpointed share and LoRA rank, for the calibration's 3 optimizer steps; the
traced peak beside the measured `peak_allocated_gib` and the planner's prediction of the day.

What it says: whether a CPU trace stands for the GPU's peak on families the GPU measured, before it is read for a
family the GPU has not (issue 34: Qwen3.5's linear-attention layers, bench/README.md "fake_trace.py"). What a CPU
trace cannot see (cuBLAS/cuDNN workspaces, the allocator's rounding) is inside the measured peaks and not in the
traced ones.

    python bench/fake_trace_check.py --out bench/results/fake_trace_check_cpu.json

`--family-points`: the planner's estimate beside the trace for eager configurations of today's families that no GPU
has measured (bench/family_models.py shapes; the H200 measured their compiled, packed plans): where the trace stands
above the plan by more than its own bias on the dense runs, the configuration is the next GPU point to measure.

    python bench/fake_trace_check.py --family-points --out bench/results/fake_trace_family_points_cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

CALIBRATION = BENCH / "results" / "memory_calibration_h200.json"


def eager_sft_runs(calibration: dict[str, Any]) -> list[dict[str, Any]]:
    """The calibration's SFT runs that fake_trace.py sets up as the stage did."""
    return [r for r in calibration["runs"] if r["stage"] == "sft" and r["status"] == "ok" and r["zero"] == 0
            and r["offload"] == "none" and r["method"] in ("lora", "full") and r["optim"] == "adamw"
            and r["fused_ce"] and not r["id"].endswith(("-lk", "-cc", "-8bit"))]


def check(run: dict[str, Any], steps: int) -> dict[str, Any]:
    from fake_trace import trace
    from family_models import shape_config

    t0 = time.monotonic()
    rows = [[run["seq_len"]] * run["micro_batch"]] * steps
    traced = trace(shape_config(run["model"]), run["method"], run["precision"], run["ckpt_fraction"],
                   [[r] for r in rows], lora_rank=run["lora_rank"] or 8)
    measured = run["peak_allocated_gib"]
    error_pct = round(100 * (traced["peak_gib"] / measured - 1), 1)
    return {"id": run["id"], "measured_gib": round(measured, 3), "traced_gib": traced["peak_gib"],
            "traced_phase": traced["phase"], "traced_vs_measured_pct": error_pct,
            "predicted_then_gib": round(run["predicted_gib"], 3), "trace_s": round(time.monotonic() - t0, 1)}


# (family_models name, method, micro-batch, seq_len, checkpointed share): eager LoRA SFT, every row full length.
FAMILY_POINTS = [("qwen3-8b", "lora", 1, 2048, 0.667), ("qwen3-8b", "lora", 2, 2048, 1.0),
                 ("qwen3-moe-8l", "lora", 4, 1024, 0.125), ("qwen3-moe-8l", "lora", 2, 2048, 0.5)]


def family_point(name: str, method: str, micro_batch: int, seq_len: int, ckpt: float, work: Path,
                 steps: int) -> dict[str, Any]:
    import family_models
    from fake_trace import trace

    from medgpt_ray.memory.estimator import TrainSetup, estimate
    from medgpt_ray.memory.shapes import load_shape

    config = family_models.family_config(name)
    config.save_pretrained(work / name)
    setup = TrainSetup(stage="sft", method=method, precision="bf16", micro_batch=micro_batch, seq_len=seq_len,
                       ckpt_fraction=ckpt, fused_ce=True, zero=0, offload="none", gpus=1, optim="adamw")
    planned = estimate(load_shape(str(work / name)), setup).peak_gib
    traced = trace(config, method, "bf16", ckpt, [[[seq_len] * micro_batch]] * steps)
    return {"model": name, "method": method, "micro_batch": micro_batch, "seq_len": seq_len, "ckpt_fraction": ckpt,
            "planned_gib": round(planned, 3), "traced_gib": traced["peak_gib"], "traced_phase": traced["phase"],
            "traced_vs_planned_pct": round(100 * (traced["peak_gib"] / planned - 1), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps traced (the calibration ran 3)")
    ap.add_argument("--only", default="", help="comma-separated id substrings")
    ap.add_argument("--family-points", action="store_true", help="the planner vs the trace on unmeasured configs")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.family_points:
        with tempfile.TemporaryDirectory() as work:
            points = [family_point(*p, Path(work), 2) for p in FAMILY_POINTS]
        for p in points:
            print(json.dumps(p), flush=True)
        if a.out:
            Path(a.out).write_text(json.dumps({"command": "python " + " ".join(sys.argv), "points": points},
                                              indent=1) + "\n")
        return
    runs = eager_sft_runs(json.loads(CALIBRATION.read_text()))
    if a.only:
        runs = [r for r in runs if any(k in r["id"] for k in a.only.split(","))]
    results = []
    for run in runs:
        results.append(check(run, a.steps))
        print(json.dumps(results[-1]), flush=True)
    errors = [r["traced_vs_measured_pct"] for r in results]
    report = {"command": "python " + " ".join(sys.argv), "calibration": str(CALIBRATION.relative_to(BENCH.parent)),
              "runs": results, "traced_vs_measured_pct": {"min": min(errors), "max": max(errors)} if errors else {}}
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
