"""Predicted vs measured peak of today's families (issue 34 item 5), from real_length_throughput.py's results.

The GPU runs (bench/README.md has their commands) train one stage through the pipeline under a 24 GiB cap on
random-init family shapes (bench/family_models.py). This script reads their JSON files and re-scores each run's
chosen configuration with this checkout's estimator (the plan the run made, at the sequence length and packing it
was planned at), so a later change to the memory model is judged against the same measurements:

    python bench/family_calibration.py --out bench/results/family_calibration.json \\
        bench/results/real_length_throughput_qwen3-8b_h200.json ...

Judged as in FIELD-NOTES: within max(10 %, 0.5 GiB) of the measured peak, and never below it.

`predicted_now_gib` is the planner's answer: the worst moment of any step, the longest rows with AdamW's states.
A run that trained the worker's unpacked fallback (a hybrid, whose packed plan the worker refused; micro-batch 1 at
the packed plan's checkpointing, which the stage kept until a fix of 2026-12-05) ran its steps length-grouped, the
longest step first (trainer_kit/shard_sampler.py): its longest rows ran before the first optimizer step created
AdamW's states, and the later steps' rows were at most `--later-rows-max` tokens. Such a run is judged on
`predicted_as_ran_gib`, the same estimator at those two moments (bench/README.md, "fake_trace.py").
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

import family_models  # noqa: E402


def unpacked(plan: Any, stage_cfg: Any) -> Any:
    """What a worker whose model could not pack once trained a packed plan as (before 2026-12-07, when such plans
    became padded by length, memory/stage_plan.binned): one example per micro-batch with every layer recomputing,
    the same examples per step. The runs this script replays ran so."""
    from dataclasses import replace

    from medgpt_ray.memory.stage_plan import deepspeed_config

    per_worker = int(plan.packing["conversations_per_step"])
    new = replace(plan, micro_batch=1, grad_accum=per_worker, ckpt_fraction=1.0, packing=None)
    return replace(new, deepspeed=deepspeed_config(new, stage_cfg))


def as_ran(shape: Any, setup: Any, est: Any, later_rows_max: int) -> dict[str, Any]:
    """The estimator at the moments a length-grouped fallback run had: its first (longest) step before AdamW's
    states existed, and the later steps with them at their rows' longest."""
    from dataclasses import replace

    from medgpt_ray.memory.estimator import estimate
    from medgpt_ray.memory.setup import GIB

    first = est.peak_bytes - est.breakdown.get("optimizer_states", 0.0)
    later = estimate(shape, replace(setup, seq_len=later_rows_max)).peak_bytes
    return {"predicted_as_ran_gib": round(max(first, later) / GIB, 3),
            "as_ran": f"first step at seq_len {setup.seq_len} without optimizer states: {first / GIB:.3f} GiB; "
                      f"later steps at <= {later_rows_max} tokens with them: {later / GIB:.3f} GiB"}


def repredict(run: dict[str, Any], work: Path, device: str, later_rows_max: int) -> dict[str, Any]:
    from dataclasses import replace

    from medgpt_ray.config import load_config
    from medgpt_ray.memory.estimator import estimate
    from medgpt_ray.memory.shapes import load_shape
    from medgpt_ray.memory.stage_plan import StagePlan
    from medgpt_ray.memory.throughput import spec_for, tokens_per_second

    shape = load_shape(str(family_models.write_config_only(run["model"], work)))
    cfg = load_config(str(BENCH.parent / "configs" / "qwen2.5-7b-4x4090.yaml"),
                      [s for s in run["sets"] if not s.startswith(("model.path=", "data.", "output_dir="))])
    fields = {k: v for k, v in run["plan"].items() if k in StagePlan.__dataclass_fields__}
    plan = StagePlan(**{**fields, "reasons": [], "alternatives": []})
    stage_cfg = cfg.stages.get(run["stage"])
    out: dict[str, Any] = {}
    if shape.linear_layers and plan.packing is not None:
        # Planned in packed rows before the planner knew a hybrid never packs: the worker refused packing and
        # trained the fallback's one conversation a micro-batch, but with the packed plan's checkpointing (the sft
        # stage handed its callbacks the packed plan until 2026-12-05, not the fallback's): that is what ran.
        ckpt = plan.ckpt_fraction
        plan = replace(unpacked(plan, stage_cfg), ckpt_fraction=ckpt)
        out["ran"] = (f"the worker's unpacked fallback of a packed plan: micro-batch 1, the packed plan's "
                      f"checkpointing ({ckpt:.0%} of the layers)")
    setup = plan.train_setup(stage_cfg)
    est = estimate(shape, setup)
    speed = tokens_per_second(shape, setup, spec_for(device))
    if "ran" in out:
        out.update(as_ran(shape, setup, est, later_rows_max))
    return {**out, "predicted_now_gib": round(est.peak_gib, 3), "breakdown_now_gib": est.breakdown_gib(),
            "predicted_now_tokens_per_s": round(speed, 1)}


def judge(measured: float, predicted: float) -> dict[str, Any]:
    gap = predicted - measured
    return {"error_gib": round(gap, 3), "error_pct": round(100 * gap / measured, 1),
            "within_target": gap >= 0 and gap <= max(0.1 * measured, 0.5), "never_above": gap >= 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="real_length_throughput.json files of family runs")
    ap.add_argument("--out", required=True)
    ap.add_argument("--later-rows-max", type=int, default=1024,
                    help="a fallback run's rows after its first (longest) step, at most (tokens)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in a.results:
            doc = json.loads(Path(path).read_text())
            for run in doc["runs"]:
                row = {"source": path, "command": doc["command"], "device": doc["device"], "name": run["name"],
                       "status": run["status"], "stage": run["stage"], "sets": run["sets"][-4:],
                       "method": run["plan"].get("method"), "micro_batch": run["plan"].get("micro_batch"),
                       "ckpt_fraction": run["plan"].get("ckpt_fraction"), "compile": run["plan"].get("compile"),
                       "packed": run["plan"].get("packing") is not None,
                       "measured_peak_gib": run.get("measured_peak_gib"),
                       "predicted_at_run_gib": run.get("predicted_peak_gib"),
                       "tokens_per_s_median": run["tokens_per_s"].get("median"),
                       "predicted_tokens_per_s": run.get("predicted_tokens_per_s")}
                if run["status"] == "ok" and row["measured_peak_gib"]:
                    row.update(repredict(run, Path(tmp), doc["device"], a.later_rows_max))
                    judged = row.get("predicted_as_ran_gib", row["predicted_now_gib"])
                    row.update(judge(row["measured_peak_gib"], judged))
                rows.append(row)
    out = {"command": shlex.join(["python", *sys.argv]), "runs": rows}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(f"{r['name']}: {r['status']} measured {r['measured_peak_gib']} GiB, predicted now "
              f"{r.get('predicted_now_gib')}, as ran {r.get('predicted_as_ran_gib')} ({r.get('error_pct')} %), "
              f"{r['tokens_per_s_median']} tokens/s (predicted now {r.get('predicted_now_tokens_per_s')})")


if __name__ == "__main__":
    main()
