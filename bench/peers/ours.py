"""Our own run of issue 50's job (common.JOB), the baseline every peer's GPU run reruns beside the peer.

The stage code the pipeline runs (stages.run_stage: build, train, finish), in this process and Ray-free (Ray's wheel
and a peer's together do not fit what one GPU run carries), planned by our planner for the 24 GiB card at the data's
own lengths, with the job's settings as config keys: LoRA r 16 / alpha 32 / dropout 0 on all linear layers,
seq_len 2048, bf16, 30 optimizer steps of ~16 conversations (effective_batch 16: packed into rows of 2048, the
count of rows a step measured from the data), compile on (what `compile: auto` picks for a dense model on a run of
50 steps or more: a user's real run; the first step's time carries the compile and is reported apart).

Counting, as every peer's: an optimizer-step hook times each step after a CUDA sync (common.StepClock); a step's
real tokens are the stage's own non-padding count (trainer_kit/packed_counts.py, metrics.jsonl), its laid-out
tokens rows x seq_len (packed rows are padded at their tail to seq_len); the peak is max allocated.

    python3 bench/peers/ours.py --model qwen2.5-7b --data FILE --work /tmp/peers --out $OUT/ours_qwen2.5-7b.json
    .venv/bin/python bench/peers/ours.py --model-dir TINY_DIR --data FILE --steps 3 --out /tmp/ours.json   # CPU
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "bench")]

import common  # noqa: E402
from common import JOB  # noqa: E402

# The bench's model (random weights saved once under WORK/models, which every tool of the run reads) and its planner
# call (the card's budget, the data's lengths).
from hybrid_sft import model_dir, plan_for, profiled, startup_profiled  # noqa: E402
from memory_calibration import single_process_env  # noqa: E402


def our_token_counts(model: Path, conversations: list[list[dict[str, str]]]) -> list[int]:
    """Each conversation's tokens as our sft stage encodes it (templates.encode_sft, cut at seq_len)."""
    from transformers import AutoTokenizer

    from medgpt_ray import templates

    tok = AutoTokenizer.from_pretrained(str(model))
    template = templates.get_template("chatml")
    return [len(templates.encode_sft(tok, template, conv, JOB.seq_len)["input_ids"]) for conv in conversations]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-7b", help="a preset shape, random weights (memory_calibration)")
    ap.add_argument("--model-dir", type=Path, help="a model directory instead")
    ap.add_argument("--data", type=Path, required=True, help="ShareGPT jsonl (MedicalGPT's SFT format)")
    ap.add_argument("--steps", type=int, default=JOB.steps)
    ap.add_argument("--cap-gib", type=float, default=JOB.cap_gib)
    ap.add_argument("--plan-gib", type=float, help="plan for a card of this size (resources.gpu_memory_gib; default "
                    "--cap-gib) under the same cap: our run at a peer's peak (Unsloth's 15.96 GiB + 10 %%: 19.56, "
                    "the plan's 2 GiB margin off)")
    ap.add_argument("--compile", default="true", choices=["auto", "true", "false"])
    ap.add_argument("--method", default="lora", choices=["lora", "qlora"])
    ap.add_argument("--attention", default="auto", choices=["auto", "sdpa", "flex"], help="stages.sft.attention")
    ap.add_argument("--micro-batch", type=int, help="stages.sft.micro_batch (default: the planner's; 1 trades a little "
                    "speed for the peak of one packed row's activations)")
    ap.add_argument("--grad-ckpt", type=float, help="stages.sft.grad_ckpt: the share of layers recomputing, pinned "
                    "(with --micro-batch: one point of the compiled-throughput fit, bench/peers/README.md)")
    ap.add_argument("--profile", type=int, default=0, help="torch profiler over this many steps after step 3")
    ap.add_argument("--profile-startup", action="store_true", help="cProfile from the stage's start to its first "
                    "step's end (issue 48: where the seconds before the first progress line go)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/peers"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from medgpt_ray.config import LoraConfig, SFTStageConfig
    from medgpt_ray.data.prepare import prepare_kind
    from medgpt_ray.memory.format import plan_line
    from medgpt_ray.stages import run_stage
    from medgpt_ray.stages.inputs import StageInputs

    single_process_env()
    gpu = torch.cuda.is_available()
    common.cap_memory(args.cap_gib)
    model = args.model_dir or model_dir(args.model, args.work)
    data = prepare_kind("sft", [str(args.data)], args.work / f"prepared-{args.data.stem}", 0.01)
    cfg = SFTStageConfig(method=args.method, lora=LoraConfig(rank=JOB.lora_r, alpha=JOB.lora_alpha,
                                                             dropout=JOB.lora_dropout, targets="all-linear"),
                         lr=JOB.lr, seq_len=JOB.seq_len, precision="bf16" if gpu else "fp32",
                         effective_batch=JOB.conversations_per_step, max_steps=args.steps, logging_steps=1,
                         save_steps=10**6, warmup_ratio=0.0, packing="auto", attention=args.attention,
                         compile={"auto": "auto", "true": True, "false": False}[args.compile],
                         micro_batch=args.micro_batch or "auto",
                         grad_ckpt=("auto" if args.grad_ckpt is None else True if args.grad_ckpt >= 1 else
                                    False if args.grad_ckpt <= 0 else args.grad_ckpt))
    plan, lengths = plan_for(model, cfg, data, (args.plan_gib or args.cap_gib) if gpu else 0)
    print("plan:", plan_line(plan), flush=True)
    out = args.work / f"run-ours-{model.name}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    clock = common.StepClock()
    hook = register_optimizer_step_post_hook(lambda *_: clock.step())
    inputs = StageInputs("sft", cfg, plan, str(model), "chatml", data.train_file, data.eval_file, str(out),
                         resume=False)
    clock.start()
    profile = None
    try:
        if args.profile:  # the profiled steps (and the one after) are slower: their tokens/s is not the benchmark's
            result, profile = profiled(lambda: run_stage(inputs), 3, args.profile)
        elif args.profile_startup:  # the first step is slower under cProfile: not the benchmark's first_step_s
            result, profile = startup_profiled(lambda: run_stage(inputs))
        else:
            result = run_stage(inputs)
    finally:
        hook.remove()
    # The stage's own non-padding count per step, from its metrics (one record per optimizer step).
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in records if "num_input_tokens_seen" in r]
    seen = [0] + [int(r["num_input_tokens_seen"]) for r in steps]
    clock.real_tokens = [b - a for a, b in zip(seen, seen[1:], strict=False)]
    clock.losses = [r["loss"] for r in steps if "loss" in r]
    packing = result.get("packing") or {}
    rows = packing.get("rows_per_step") or (plan.packing or {}).get("rows_per_step")
    clock.padded_tokens = [rows * JOB.seq_len] * len(clock.real_tokens) if rows else []
    conversations = common.load_conversations(args.data)[:200]
    check = common.compare_counts(common.reference_token_counts(model, conversations, JOB.seq_len),
                           our_token_counts(model, conversations))
    notes = [f"plan: {plan_line(plan)}", f"lengths: {lengths.describe() if lengths else None}",
             "real tokens per step: the stage's own non-padding count (packed_counts); laid out: rows x seq_len"]
    settings = {"method": args.method, "compile": args.compile, "attention": args.attention, "packing": packing,
                "plan_gib": args.plan_gib or args.cap_gib,
                "micro_batch": args.micro_batch or "auto",
                "plan": plan.to_dict(),
                "predicted_peak_gib": plan.prediction.peak_gib if plan.prediction else None,
                **({"profile": profile} if profile else {})}
    common.write_result(args.out, "medgpt-ray", _version(), settings, clock, model, args.data, check, notes)
    return 0


def _version() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"


if __name__ == "__main__":
    raise SystemExit(main())
