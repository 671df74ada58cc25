"""The opd stage's memory plan against a real run on a GPU: the planner's plan (under a 24 GiB card's budget) of an
on-policy distillation stage, the student a LoRA on a random-init Qwen2.5 shape and the teacher a frozen model
beside it, then the stage's own code (kinds/opd/stage.py, TRL's GKDTrainer) trained a few steps under an allocator
cap of that card; the measured peak is set beside the plan's prediction and its breakdown.

Each configuration runs in a process of its own (a fresh peak counter). `lmbda` 1 makes the student generate its
answer in every micro-batch (max_new_tokens of sampled tokens: a random model does not stop early), `lmbda` 0 never
(the reference answers, rows of exactly seq_len: bench/memory_calibration.prepare_data's long records).
Stage code is called in one process, no Ray: the wheelhouse is `bash ../shared/gpu/make-wheelhouse.sh --no-ray --bnb`.

    # the GPU machine:
    python3 bench/opd_memory_check.py --model qwen2.5-1.5b --out $OUT/opd_memory.json
    # a 7B teacher in NF4 beside a 1.5B student (issue 49 item 3; carry bitsandbytes: bench/make_bnb_wheel.sh)
    python3 bench/opd_memory_check.py --model qwen2.5-1.5b --teacher qwen2.5-7b --teacher-quantization 4bit \
        --micro-batches 2 1 --lmbdas 0 1 --steps 4 --out $OUT/opd_7b_nf4_teacher.json
    # here (CPU, the tiny preset, no cap): a smoke run of the same path
    .venv/bin/python bench/opd_memory_check.py --model tiny --seq-len 128 --max-new-tokens 16 --out /tmp/opd.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT), str(BENCH)]

from memory_calibration import GIB, cap_allocator, prepare_data, prepare_model, single_process_env  # noqa: E402


def stage_config(c: dict[str, Any], teacher: Path) -> Any:
    from medgpt_ray.config import LoraConfig
    from medgpt_ray.kinds.opd.config import OPDStageConfig

    return OPDStageConfig(method="lora", lora=LoraConfig(rank=8, alpha=16), lr=1e-5, max_steps=c["steps"],
                          seq_len=c["seq_len"], max_new_tokens=c["max_new_tokens"], lmbda=c["lmbda"],
                          teacher=str(teacher), teacher_quantization=c.get("teacher_quantization", "none"),
                          micro_batch=c["micro_batch"], effective_batch=c["micro_batch"],
                          logging_steps=1, save_steps=10**6, warmup_ratio=0.0)


def planned(c: dict[str, Any], cfg: Any) -> Any:
    from medgpt_ray.memory.budget import make_budget
    from medgpt_ray.memory.planner import plan_stage
    from medgpt_ray.memory.shapes import load_shape

    if not c["gpu"]:
        return plan_stage("opd", cfg, 1, False)
    return plan_stage("opd", cfg, 1, True, load_shape(c["model"]),
                      make_budget(c["cap_gib"], 2.0, "rtx4090", True, "bench cap"))


def measure(c: dict[str, Any]) -> dict[str, Any]:
    """One configuration, in this process: plan it, build the stage, train a few steps, read the peak."""
    import torch

    from medgpt_ray.stages import build_stage
    from medgpt_ray.stages.inputs import StageInputs

    single_process_env()
    if c["gpu"]:
        cap_allocator(c["cap_gib"])
    work = Path(c["work"])
    model = work / "models" / c["model"]
    # The teacher: by default the same shape, a second frozen copy beside the student; --teacher another preset
    # (a 7B teacher over a 1.5B student: heads of 152,064 and 151,936 rows over one tokenizer).
    cfg = stage_config(c, work / "models" / c.get("teacher", c["model"]))
    plan = planned(c, cfg)
    split = work / "data" / "prepared" / "sft" / "sft.train.parquet"
    inp = StageInputs("opd", cfg, plan, str(model), "chatml", str(split), str(split.with_name("sft.eval.parquet")),
                      str(work / "runs" / c["id"]), resume=False)
    out: dict[str, Any] = {**c, "plan": {"micro_batch": plan.micro_batch, "ckpt_fraction": plan.ckpt_fraction,
                                         "fused_ce": plan.fused_ce},
                           "predicted_gib": plan.prediction.peak_gib, "predicted_moment": plan.prediction.moment,
                           "breakdown_gib": plan.prediction.breakdown_gib}
    built = build_stage(inp)
    built.trainer.args.save_strategy = "no"
    if c["gpu"]:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        built.trainer.train()
        out["status"] = "ok"
    except torch.OutOfMemoryError:
        out["status"] = "oom"
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    metrics = work / "runs" / c["id"] / "metrics.jsonl"  # the stage's own per-step counts (StageProgress)
    if metrics.is_file():
        steps = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        out["tokens_per_s"] = [round(r["tokens_per_s"]) for r in steps if "tokens_per_s" in r]
    if c["gpu"]:
        out["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 3)
        out["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / GIB, 3)
        out["error_gib"] = round(out["predicted_gib"] - out["peak_allocated_gib"], 3)
    return out


def child(c: dict[str, Any]) -> dict[str, Any]:
    p = subprocess.run([sys.executable, __file__, "--one", json.dumps(c)], capture_output=True, text=True, cwd=ROOT)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {**c, "status": "error", "error": (p.stderr or p.stdout)[-2500:]}
    return json.loads(lines[-1][7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--teacher", help="the teacher's preset (random weights; default: --model's shape)")
    ap.add_argument("--teacher-quantization", default="none", choices=["none", "4bit"])
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--micro-batches", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--lmbdas", type=float, nargs="+", default=[1.0, 0.0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cap-gib", type=float, default=24.0)
    ap.add_argument("--workdir", default="/tmp/medgpt-opd")
    ap.add_argument("--out")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print("RESULT " + json.dumps(measure(json.loads(a.one))), flush=True)
        return

    import torch

    from medgpt_ray.tiny import ensure_tiny

    work, gpu = Path(a.workdir), torch.cuda.is_available()
    if a.model == "tiny":
        model_dir = work / "models" / "tiny"
        if not model_dir.exists():
            model_dir.parent.mkdir(parents=True, exist_ok=True)
            model_dir.symlink_to(ensure_tiny())
    else:
        prepare_model(a.model, work / "models", ensure_tiny())
        if a.teacher and a.teacher != a.model:
            prepare_model(a.teacher, work / "models", ensure_tiny())
    prepare_data(work / "data", n=16)
    runs = []
    for mb in a.micro_batches:
        for lmbda in a.lmbdas:
            teacher = f"-t{a.teacher}-{a.teacher_quantization}" if a.teacher else ""
            c = {"id": f"{a.model}{teacher}-opd-lora-mb{mb}-s{a.seq_len}-new{a.max_new_tokens}-lmbda{lmbda}",
                 "model": a.model, "teacher": a.teacher or a.model, "teacher_quantization": a.teacher_quantization,
                 "seq_len": a.seq_len, "max_new_tokens": a.max_new_tokens, "micro_batch": mb,
                 "lmbda": lmbda, "steps": a.steps, "cap_gib": a.cap_gib, "gpu": gpu, "work": str(work)}
            r = child(c)
            print(f"{r['id']}: {r['status']} measured {r.get('peak_allocated_gib', '-')} GiB, predicted "
                  f"{r.get('predicted_gib', 0):.2f} GiB ({r.get('predicted_moment', '-')})", flush=True)
            runs.append(r)
            doc = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(0) if gpu else "cpu",
                   "versions": {m: __import__(m).__version__ for m in ("torch", "transformers", "trl", "peft")},
                   "runs": runs}
            if a.out:  # after every configuration: a run cut short keeps what it measured
                Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
