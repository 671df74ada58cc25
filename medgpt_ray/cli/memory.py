"""`medgpt-ray estimate` (one setup's peak GPU memory) and `medgpt-ray plan` (every stage of a config)."""

from __future__ import annotations

import argparse
import json
import sys

from medgpt_ray.cli.args import config_error, fraction, non_negative_float, positive_float, positive_int
from medgpt_ray.cli.run import add_config_args
from medgpt_ray.config import STAGE_KINDS, ConfigError
from medgpt_ray.memory.estimator import SetupError, TrainSetup, estimate
from medgpt_ray.memory.format import format_plan
from medgpt_ray.memory.profiles import setup_fields
from medgpt_ray.memory.shapes import PRESETS, ShapeError, load_shape
from medgpt_ray.memory.throughput import GPU_SPECS, tokens_per_second


def memory_kinds() -> list[str]:
    """The memory models the registered training kinds follow, in pipeline order (TrainSetup's `stage`)."""
    return list(dict.fromkeys(k.memory_kind for k in STAGE_KINDS.values() if k.trains))


def add_estimate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True,
                   help=f"a local model directory (config.json only) or a preset: {', '.join(['tiny', *PRESETS])}")
    p.add_argument("--stage", required=True, choices=memory_kinds(),
                   help="the memory model: a training stage kind's own, or the one it follows (simpo: orpo)")
    p.add_argument("--method", required=True, choices=["full", "lora", "qlora"])
    p.add_argument("--lora-rank", type=positive_int, default=8)
    p.add_argument("--lora-experts", action="store_true",
                   help="a MoE's routed experts adapted too (the lora.experts key; not with --zero 3)")
    p.add_argument("--precision", required=True, choices=["bf16", "amp-bf16", "fp32"],
                   help="bf16: weights in bf16; amp-bf16: fp32 master weights, bf16 autocast")
    p.add_argument("--micro-batch", type=positive_int, required=True)
    p.add_argument("--seq-len", type=positive_int, required=True)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--grad-ckpt", dest="grad_ckpt", action="store_true")
    g.add_argument("--no-grad-ckpt", dest="grad_ckpt", action="store_false")
    p.add_argument("--ckpt-layers", type=fraction, default=1.0, metavar="FRACTION",
                   help="with --grad-ckpt: share of the layers checkpointed (default 1: all)")
    f = p.add_mutually_exclusive_group(required=True)
    f.add_argument("--fused-ce", dest="fused_ce", action="store_true")
    f.add_argument("--no-fused-ce", dest="fused_ce", action="store_false")
    p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    p.add_argument("--offload", default="none", choices=["none", "optimizer", "all"])
    p.add_argument("--gpus", type=positive_int, default=1)
    p.add_argument("--optim", default="adamw", choices=["adamw", "adamw-8bit"])
    p.add_argument("--fused-kernels", action="store_true", help="Liger's RMSNorm/SwiGLU/RoPE kernels (pt, sft, dpo)")
    p.add_argument("--grad-accum", type=positive_int, default=1)
    p.add_argument("--gpu-type", default="rtx4090", choices=sorted(GPU_SPECS), help="for the tokens/s prediction")
    p.add_argument("--json", action="store_true", help="print {peak_gib, breakdown, ...} as JSON")


def run_estimate(args: argparse.Namespace) -> int:
    if args.grad_ckpt and not 0 < args.ckpt_layers <= 1:
        print(f"error: --ckpt-layers {args.ckpt_layers}: a fraction in (0, 1]", file=sys.stderr)
        return 2
    try:
        shape = load_shape(args.model)
        setup = TrainSetup(stage=args.stage, method=args.method, precision=args.precision,
                           micro_batch=args.micro_batch, seq_len=args.seq_len,
                           ckpt_fraction=args.ckpt_layers if args.grad_ckpt else 0.0, fused_ce=args.fused_ce,
                           zero=args.zero, offload=args.offload, gpus=args.gpus, optim=args.optim,
                           lora_rank=args.lora_rank, lora_experts=args.lora_experts, grad_accum=args.grad_accum,
                           fused_kernels=args.fused_kernels)
        est = estimate(shape, setup)
    except (ShapeError, SetupError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tps = tokens_per_second(shape, setup, GPU_SPECS[args.gpu_type])
    if args.json:
        print(json.dumps({"model": shape.name, "params": shape.params, "peak_gib": round(est.peak_gib, 3),
                          "moment": est.moment, "breakdown": est.breakdown_gib(),
                          "tokens_per_s_per_gpu": round(tps, 1), "gpu_type": args.gpu_type,
                          "setup": setup.__dict__}, indent=1))
        return 0
    print(f"{shape.name} ({shape.params / 1e9:.2f}B params), {args.stage} {args.method}, {args.precision}, "
          f"micro-batch {args.micro_batch} x seq {args.seq_len}")
    print(f"predicted peak allocated: {est.peak_gib:.2f} GiB (at {est.moment})")
    for k, v in sorted(est.breakdown_gib().items(), key=lambda kv: -kv[1]):
        print(f"  {k:24s} {v:8.2f} GiB")
    print(f"predicted throughput on {GPU_SPECS[args.gpu_type].name}: {tps:,.0f} tokens/s per GPU")
    if own_networks(args.stage):
        print(f"note: {args.stage}'s own keys are not read here, nor what they add (a frozen network, a generation "
              f"phase); `medgpt-ray plan --config FILE` prices them")
    return 0


def own_networks(kind: str) -> bool:
    """Whether a memory kind's own keys, at their defaults, add a network or a generation phase to its TrainSetup
    (opd's teacher, grpo's rollouts): what `estimate`, which reads no config, leaves out."""
    entry = STAGE_KINDS[kind]
    fields = setup_fields(kind, entry.config_class.model_validate(entry.defaults), True)
    return bool(fields.get("kind_terms") or fields.get("generations"))


def add_plan_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--gpu-mem-gib", type=positive_float, default=None,
                   help="per-GPU memory to plan for (default: resources.gpu_memory_gib, the local GPU, else 24)")
    p.add_argument("--margin-gib", type=non_negative_float, default=None,
                   help="safety margin (default resources.memory_margin_gib)")
    p.add_argument("--json", action="store_true", help="print every stage's plan.json")


def run_plan(args: argparse.Namespace) -> int:
    from medgpt_ray.config import load_config
    from medgpt_ray.memory.planner import plan_all

    try:
        # The flags are overrides like any --set: the config is validated once, frozen (docs/ARCHITECTURE.md).
        sets = [*args.sets, *(f"resources.{key}={value}" for key, value in
                              (("gpu_memory_gib", args.gpu_mem_gib), ("memory_margin_gib", args.margin_gib))
                              if value is not None)]
        cfg = load_config(args.config, sets, args.overrides)
        plans, errors = plan_all(cfg, default_gpu_gib=24.0)
    except ConfigError as e:
        return config_error(e)
    if args.json:
        print(json.dumps({"plans": {s: p.to_dict() for s, p in plans.items()}, "errors": errors}, indent=1))
    else:
        for plan in plans.values():
            print("\n".join(format_plan(plan)))
        for msg in errors.values():
            print(msg)
    return 1 if errors else 0
