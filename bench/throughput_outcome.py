"""Does the planner buy speed? Qwen2.5-7B shape, LoRA r8 all-linear, seq 2048, under a 24 GiB cap.

Side by side, one process at a time on the same GPU (no other work):
  field-report  what MedicalGPT users run on a 4090: micro-batch 1, full gradient checkpointing, HF Trainer's
                default loss (no fused CE), peft as it comes (fp32 adapters, every adapted input cast to fp32);
                our pt stage is exactly that trainer on full 2048-token blocks
  field-knobs-runner  the same knobs through our pt stage as it now runs every stage (bf16 LoRA inputs,
                stages/speed.py): the speed-up that is the planner's alone
  field-knobs-trl  the same knobs through our SFT stage (TRL's chunked LM head)
  planner-sft   the planner's choice for the SFT stage (TRL, its chunked LM head) under the same cap
  planner-dpo   the planner's choice for 7B LoRA DPO at seq 1024 under the same cap
Each runs the real stage code (build + train) for a few optimizer steps at the same effective batch; tokens/s
is measured after the first step, peak allocated over the whole run.

    python bench/throughput_outcome.py --workdir /tmp/calib --out $OUT/throughput_outcome_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import memory_calibration as calib  # noqa: E402

CAP_GIB = 24.0
MARGIN_GIB = 2.0
EFFECTIVE_BATCH = 8


def planned(stage: str, seq_len: int) -> dict[str, Any]:
    """The planner's choice for a 24 GiB card, for the calibration runner."""
    from medgpt_ray.config import DPOStageConfig, LoraConfig, StageConfig
    from medgpt_ray.memory.budget import make_budget
    from medgpt_ray.memory.planner import plan_stage
    from medgpt_ray.memory.shapes import load_shape

    cls = DPOStageConfig if stage == "dpo" else StageConfig
    cfg = cls(method="lora", lora=LoraConfig(rank=8, alpha=16, dropout=0.05), seq_len=seq_len,
              effective_batch=EFFECTIVE_BATCH)
    plan = plan_stage(stage, cfg, 1, True, load_shape("qwen2.5-7b"),
                      make_budget(CAP_GIB, MARGIN_GIB, "h200", True, "24 GiB cap"))
    return {"plan": plan.to_dict(), "run": {**calib.run_cfg("qwen2.5-7b", stage, "lora", plan.precision,
                                                           plan.micro_batch, seq_len, plan.ckpt_fraction,
                                                           fused=plan.fused_ce, zero=plan.zero_stage,
                                                           offload=plan.offload, rank=8,
                                                           kernels=plan.fused_kernels, compiled=plan.compile),
                                            "grad_accum": plan.grad_accum}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/medgpt-calib")
    ap.add_argument("--out")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--runs", default="field-report,field-knobs-runner,field-knobs-trl,planner-sft,planner-dpo")
    a = ap.parse_args()

    import torch

    from medgpt_ray.tiny import ensure_tiny

    work = Path(a.workdir)
    calib.prepare_model("qwen2.5-7b", work / "models", ensure_tiny())
    calib.prepare_data(work / "data")
    field = {**calib.run_cfg("qwen2.5-7b", "pt", "lora", "bf16", 1, 2048, 1.0, fused=False, rank=8),
             "grad_accum": EFFECTIVE_BATCH, "tag": "field-report"}
    sft = planned("sft", 2048)
    dpo = planned("dpo", 1024)
    # The field report's knobs through our SFT stage (TRL's loss path): splits the gain into loss path and knobs.
    trl_mb1 = {**calib.run_cfg("qwen2.5-7b", "sft", "lora", "bf16", 1, 2048, 1.0, rank=8),
               "grad_accum": EFFECTIVE_BATCH, "tag": "field-knobs-trl"}
    runs = [("field-report", {**field, "lora_input_casts": True}, None),
            ("field-knobs-runner", {**field, "tag": "field-knobs-runner"}, None),
            ("field-knobs-trl", trl_mb1, None),
            ("planner-sft", {**sft["run"], "tag": "planner-sft"}, sft["plan"]),
            ("planner-dpo", {**dpo["run"], "tag": "planner-dpo"}, dpo["plan"])]
    runs = [r for r in runs if r[0] in a.runs.split(",")]
    results = []
    t0 = time.time()
    for name, cfg, plan in runs:
        r = calib.run_child(ROOT / "bench" / "memory_calibration.py", cfg,
                            ["--workdir", str(work), "--cap-gib", str(CAP_GIB), "--steps", str(a.steps)])
        r["name"] = name
        if plan is not None:
            r["planner_prediction"] = plan["prediction"]
            r["planner_choice"] = {k: plan[k] for k in ("micro_batch", "grad_accum", "ckpt_fraction", "fused_ce",
                                                        "fused_kernels", "compile", "zero_stage", "offload")}
        results.append(r)
        print(f"[{time.time() - t0:6.1f}s] {name}: {r.get('status')} {r.get('peak_allocated_gib', 0):.2f} GiB "
              f"{r.get('tokens_per_s', 0):,.0f} tokens/s", flush=True)
    by = {r["name"]: r for r in results}

    def ratio(a: str, b: str) -> float | None:
        if by.get(a, {}).get("tokens_per_s") and by.get(b, {}).get("tokens_per_s"):
            return by[a]["tokens_per_s"] / by[b]["tokens_per_s"]
        return None

    speedup = ratio("planner-sft", "field-report")
    doc = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(0), "cap_gib": CAP_GIB,
           "margin_gib": MARGIN_GIB, "effective_batch": EFFECTIVE_BATCH, "steps": a.steps,
           "versions": {m: __import__(m).__version__ for m in ("torch", "transformers", "trl", "peft")},
           "runs": results, "sft_speedup_vs_field_report": speedup,
           "sft_speedup_vs_field_knobs_in_runner": ratio("planner-sft", "field-knobs-runner"),
           "dpo_fits_24gib": by.get("planner-dpo", {}).get("status") == "ok"}
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({"speedup": speedup, "dpo_fits_24gib": doc["dpo_fits_24gib"]}))


if __name__ == "__main__":
    main()
