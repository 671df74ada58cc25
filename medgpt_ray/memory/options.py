"""The values each of a stage's memory knobs may take: the explicit one (checked), or the set the planner searches,
each with the reason the plan records. What a kind's trainer allows comes from its memory profile
(memory/profiles.py)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from medgpt_ray.config import ConfigError, StageConfig
from medgpt_ray.memory.expert_lora import check_expert_lora
from medgpt_ray.memory.kind_memory import MemoryProfile
from medgpt_ray.memory.lengths import LengthProfile, packing_reason, packs, rows_per_step
from medgpt_ray.memory.profiles import setup_fields, stage_profile
from medgpt_ray.memory.shapes import ModelShape

MAX_MICRO_BATCH = 64
CKPT_STEPS = 8  # checkpointing fractions searched: 0, 1/8, ..., 1 of the layers
COMPILE_MIN_STEPS = 50

Note = Callable[[str, Any, list[Any], str], list[Any]]


def liger_available() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def compiles(cfg: StageConfig, use_gpu: bool, method: str, zero: int, shape: ModelShape) -> bool:
    """Whether the decoder layers are compiled (stages/speed.py). Automatic only where it was measured:
    GPU runs with bf16 LoRA or full weights; 4-bit layers and ZeRO-3's parameter hooks are left eager. A
    stage capped below COMPILE_MIN_STEPS steps stays eager too: compiling costs each worker 20-60 s first. A
    hybrid model stays eager on `auto`: compiling transformers' PyTorch delta rule (its chunk loop unrolled) had not
    finished the first step of a 0.8B Qwen3.5 after 4 minutes on the H200 (issue 34). Its token mixing now stays
    eager inside a compiled layer (hybrid/layers.py, a graph break), so `compile: true` compiles the rest of each
    layer; not yet measured on a GPU, hence not `auto`. With
    `lora.experts` neither: PEFT registers and removes a parametrization on the experts in every forward, where
    dynamo breaks the graph (six breaks a layer on CPU, torch 2.13; it trains, uncompiled there)."""
    if cfg.compile != "auto":
        return bool(cfg.compile)
    short = 0 < cfg.max_steps < COMPILE_MIN_STEPS
    return (use_gpu and method != "qlora" and zero != 3 and not short and not shape.linear_layers
            and not cfg.lora.experts)


def liger_for(shape: ModelShape, part: str) -> bool:
    """liger-kernel is installed and covers this family's `layers` (RMSNorm/SwiGLU/RoPE) or `fused_ce`."""
    return liger_available() and (shape.liger_layers if part == "layers" else shape.liger_fused_ce)


def _divisors(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def _noter(reasons: list[str]) -> Note:
    """`note(key, value, searched, why)`: the values a knob takes, its reason appended to `reasons`."""

    def note(key: str, value: Any, searched: list[Any], why: str) -> list[Any]:
        if value == "auto":
            reasons.append(f"{key}: searched {searched} ({why})")
            return searched
        reasons.append(f"{key}: {value} (explicit)")
        return [value]

    return note


def _micro_options(stage: str, cfg: StageConfig, per_worker: int, lengths: LengthProfile | None,
                   reasons: list[str], note: Note) -> tuple[list[int], int]:
    """(micro-batches searched, examples per worker step): divisors of the per-worker batch, or for packed SFT of
    the packed rows that hold it (an explicit micro-batch caps the rows per micro-batch)."""
    if not packs(stage, cfg, lengths):
        floor = cfg.min_micro_batch
        searched = [d for d in _divisors(per_worker, MAX_MICRO_BATCH) if d >= floor]
        if not searched:
            raise ConfigError(f"stages.{stage}.effective_batch: {cfg.effective_batch} leaves no micro-batch of at "
                              f"least {floor} that divides the per-worker batch {per_worker} ({stage}'s trainer "
                              f"needs {floor} or more examples per micro-batch)")
        return note("micro_batch", cfg.micro_batch, searched, f"divisors of the per-worker batch {per_worker}"
                    + (f", at least {floor}" if floor > 1 else "")), per_worker
    assert lengths is not None and lengths.conversations_per_row is not None
    rows = rows_per_step(per_worker, lengths.conversations_per_row)
    reasons.append(packing_reason(stage, cfg.seq_len, per_worker, rows, lengths.conversations_per_row))
    searched = _divisors(rows, MAX_MICRO_BATCH)
    if cfg.micro_batch != "auto":
        searched = [max(d for d in searched if d <= cfg.micro_batch)]
    return note("micro_batch", "auto", searched, f"rows: divisors of the {rows} packed rows per step"), rows


def _method_options(where: str, cfg: StageConfig, use_gpu: bool, note: Note) -> list[str]:
    methods = note("method", cfg.method, ["lora", "qlora"] if use_gpu else ["lora"],
                   "LoRA or QLoRA; full only when asked" if use_gpu else "QLoRA needs a GPU")
    if "qlora" in methods and not use_gpu:
        raise ConfigError(f"{where}.method: 'qlora' needs GPUs (bitsandbytes 4-bit); resources.use_gpu is false")
    if cfg.precision != "auto" and cfg.precision != "fp32" and not use_gpu:
        raise ConfigError(f"{where}.precision: '{cfg.precision}' needs GPUs; use 'fp32' (or auto) on CPU")
    return methods


def _per_worker_batch(where: str, cfg: StageConfig, num_workers: int) -> int:
    per_worker, rem = divmod(cfg.effective_batch, num_workers)
    if rem or per_worker == 0:
        raise ConfigError(f"{where}.effective_batch: {cfg.effective_batch} is not a multiple of the {num_workers} "
                          f"data-parallel workers")
    if cfg.micro_batch != "auto" and per_worker % cfg.micro_batch:
        raise ConfigError(f"{where}.micro_batch: {cfg.micro_batch} does not divide the per-worker batch {per_worker} "
                          f"(effective_batch {cfg.effective_batch} / {num_workers} workers)")
    return per_worker


def _check_whole_groups(where: str, cfg: StageConfig, per_worker: int, num_workers: int,
                        group: int | None) -> None:
    """A generating stage's worker normalises whole groups of `group` completions (one prompt's): its share of the
    step must hold whole groups, or no generate call can be planned."""
    if group and per_worker % group:
        fit = group * num_workers
        raise ConfigError(f"{where}.effective_batch: {cfg.effective_batch} completions a step over {num_workers} "
                          f"workers is {per_worker} each, not whole groups of num_generations {group} (one prompt's "
                          f"completions stay on one worker): an effective_batch that is a multiple of {fit}, or a "
                          f"num_generations that divides {per_worker}")


def _ckpt_options(cfg: StageConfig, shape: ModelShape, note: Note) -> list[Any]:
    step = max(1, shape.layers // CKPT_STEPS)
    fractions = sorted({k / shape.layers for k in [*range(0, shape.layers + 1, step), shape.layers]})
    if cfg.grad_ckpt == "auto":
        return note("grad_ckpt", "auto", [round(f, 3) for f in fractions], "share of layers recomputing")
    value = 1.0 if cfg.grad_ckpt is True else 0.0 if cfg.grad_ckpt is False else float(cfg.grad_ckpt)
    return note("grad_ckpt", value, [], "")


def _fused_ce_options(stage: str, cfg: StageConfig, profile: MemoryProfile, shape: ModelShape, use_gpu: bool,
                      note: Note) -> list[Any]:
    """The trainer decides the loss path (its profile's `fused_ce_allowed`); only Liger's fused linear CE (pt) is
    a choice, searched where Liger and a GPU are present."""
    where = f"stages.{stage}"
    liger = profile.liger_fused_ce
    if liger:
        fused_auto = [False, True] if (use_gpu and liger_for(shape, "fused_ce")) else [False]
    else:
        fused_auto = list(profile.fused_ce_allowed)
    if cfg.fused_ce != "auto":
        if cfg.fused_ce not in profile.fused_ce_allowed:
            raise ConfigError(f"{where}.fused_ce: " + profile.fused_ce_refusal.format(stage=stage))
        if liger and cfg.fused_ce and not use_gpu:
            raise ConfigError(f"{where}.fused_ce: Liger's fused linear cross-entropy needs a GPU")
        if liger and cfg.fused_ce and not liger_available():
            raise ConfigError(f"{where}.fused_ce: needs liger-kernel: pip install 'medgpt-ray[gpu]'")
        if liger and cfg.fused_ce and not shape.liger_fused_ce:
            raise ConfigError(f"{where}.fused_ce: liger-kernel has no fused linear CE for {shape.name}'s family")
    why_fused = ("Liger fused linear CE" + ("" if liger_for(shape, "fused_ce") else " unavailable: liger-kernel not "
                                            "installed or not for this family") if liger else "fixed by the trainer")
    return note("fused_ce", cfg.fused_ce, fused_auto, why_fused)


def _kernel_options(where: str, cfg: StageConfig, profile: MemoryProfile, shape: ModelShape, use_gpu: bool,
                    note: Note) -> list[Any]:
    # A hybrid, or a MoE with `lora.experts`, is never compiled on `auto` (compiles()): only Liger would fuse its
    # layers. Liger has no RoPE for a hybrid, and its SwiGLU reads the experts' `hidden_dim`, which PEFT's wrapper
    # of the adapted experts hides (the H100 run of lora.experts failed on it: bench/README.md).
    compilable = cfg.compile is True or (cfg.compile == "auto" and not shape.linear_layers and not cfg.lora.experts)
    wrapped_experts = cfg.lora.experts and shape.experts > 0
    fusable = use_gpu and ((liger_for(shape, "layers") and not wrapped_experts) or compilable)
    if cfg.fused_kernels is True:
        if not profile.fused_kernels:
            raise ConfigError(f"{where}.fused_kernels: {profile.kernels_refusal}")
        if wrapped_experts and not compilable:
            raise ConfigError(f"{where}.fused_kernels: not with lora.experts unless compile is true: Liger's "
                              "SwiGLU cannot run on the experts PEFT wraps to adapt them")
        if not fusable:
            raise ConfigError(f"{where}.fused_kernels: fused layer kernels need a GPU and either compile "
                              f"(not false) or liger-kernel (pip install 'medgpt-ray[gpu]') with kernels for "
                              f"this model's family")
    kernels_auto = [False, True] if (fusable and profile.fused_kernels) else [False]
    return note("fused_kernels", cfg.fused_kernels, kernels_auto,
                "fused RMSNorm/SwiGLU/RoPE: compiled layers, else Liger"
                + ("" if liger_available() else " (liger-kernel not installed)"))


def options(stage: str, cfg: StageConfig, shape: ModelShape, num_workers: int, use_gpu: bool,
            reasons: list[str], lengths: LengthProfile | None = None) -> dict[str, list[Any]]:
    """The values each knob may take: the explicit one, or the searched set, each with its reason."""
    where = f"stages.{stage}"
    profile = stage_profile(stage)  # the built-in kind whose trainer and memory model it follows
    note = _noter(reasons)
    methods = _method_options(where, cfg, use_gpu, note)
    check_expert_lora(where, cfg, shape)
    per_worker = _per_worker_batch(where, cfg, num_workers)
    _check_whole_groups(where, cfg, per_worker, num_workers, setup_fields(stage, cfg, use_gpu).get("generations"))
    micro, per_worker = _micro_options(stage, cfg, per_worker, lengths, reasons, note)
    ckpt = _ckpt_options(cfg, shape, note)
    fused = _fused_ce_options(stage, cfg, profile, shape, use_gpu, note)
    kernels = _kernel_options(where, cfg, profile, shape, use_gpu, note)

    optim = note("optim", cfg.optim, ["adamw"], "AdamW")
    if optim == ["adamw-8bit"] and not use_gpu:
        raise ConfigError(f"{where}.optim: 'adamw-8bit' needs a GPU (bitsandbytes)")

    zero_pairs = zero_options(stage, cfg, methods, num_workers, use_gpu)
    if cfg.lora.experts:  # refused with zero_stage 3 (check_expert_lora); not searched either
        zero_pairs = [p for p in zero_pairs if p[0] != 3]
    reasons.append(f"zero_stage/offload: {'searched ' if len(zero_pairs) > 1 else ''}"
                   f"{[f'{z}/{o}' for z, o in zero_pairs]}")
    return {"method": methods, "micro": micro, "ckpt": ckpt, "fused": fused, "kernels": kernels, "optim": optim,
            "zero": zero_pairs, "per_worker": [per_worker]}


def zero_options(stage: str, cfg: StageConfig, methods: list[str], num_workers: int,
                  use_gpu: bool) -> list[tuple[int, str]]:
    where = f"stages.{stage}"
    if cfg.offload not in ("auto", "none") and cfg.zero_stage == 0:
        raise ConfigError(f"{where}.offload: '{cfg.offload}' needs zero_stage >= 1")
    if cfg.offload == "all" and cfg.zero_stage not in ("auto", 3):
        raise ConfigError(f"{where}.offload: 'all' (parameter offload) needs zero_stage 3")
    if cfg.zero_stage == 3 and methods == ["qlora"]:
        raise ConfigError(f"{where}.zero_stage: 3 cannot shard 4-bit QLoRA weights; use 0, 1 or 2")
    if cfg.zero_stage != "auto" and cfg.offload != "auto":
        return [(int(cfg.zero_stage), cfg.offload)]
    if cfg.zero_stage != "auto":
        z = int(cfg.zero_stage)
        return [(z, "none")] + ([(z, "optimizer")] if z >= 1 and use_gpu else []) + \
            ([(3, "all")] if z == 3 and use_gpu else [])
    if not use_gpu:
        return [(0, cfg.offload if cfg.offload != "auto" else "none")] if cfg.offload in ("auto", "none") else \
            [(3 if cfg.offload == "all" else 2, cfg.offload)]
    pairs: list[tuple[int, str]] = [(0, "none")]
    if "full" in methods:
        pairs += [(2, "optimizer"), (3, "optimizer"), (3, "all")]
        if num_workers > 1:
            pairs += [(1, "none"), (2, "none"), (3, "none")]
    elif num_workers > 1 and "lora" in methods:
        pairs.append((3, "none"))  # shards the frozen base weights over the workers
    if cfg.offload != "auto":
        pairs = [p for p in pairs if p[1] == cfg.offload] or [(3 if cfg.offload == "all" else 2, cfg.offload)]
    return pairs
