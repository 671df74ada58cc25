"""Turn a stage's config into a StagePlan: the fastest configuration predicted to fit the GPU.

Every `auto` knob (method lora/qlora, micro-batch, checkpointing fraction, fused CE, ZeRO stage and offload) is
searched; explicit values are kept and checked. The effective batch stays what the config says: micro-batch x
accumulation x workers. Candidates are scored by the estimator (peak memory) and the throughput model (tokens/s);
the fastest one whose peak fits budget - margin wins, and the plan records it with the best rejected alternatives.
"""

from __future__ import annotations

import importlib.util
import itertools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from medgpt_ray.config import ConfigError, PipelineConfig, StageConfig, stage_kind
from medgpt_ray.memory.budget import Budget, GpuProbe, gib, make_budget, resolve_budget
from medgpt_ray.memory.estimator import Estimate, SetupError, TrainSetup
from medgpt_ray.memory.generation import generation_choices, reward_model_placement, rl_hints, setup_fields
from medgpt_ray.memory.generation import peak as estimate
from medgpt_ray.memory.lengths import LengthProfile, packing_reason, packs, planned_seq_len, rows_per_step
from medgpt_ray.memory.shapes import ModelShape, ShapeError, load_shape
from medgpt_ray.memory.stage_plan import Prediction, StagePlan, deepspeed_config
from medgpt_ray.memory.throughput import tokens_per_second

MAX_MICRO_BATCH = 64
CKPT_STEPS = 8  # checkpointing fractions searched: 0, 1/8, ..., 1 of the layers


class PlanError(ConfigError):
    """Nothing fits (or the explicit configuration does not): the message carries the numbers."""

    smallest_peak_gib: float | None = None


@dataclass
class Candidate:
    setup: TrainSetup
    est: Estimate
    tokens_per_s: float
    host_node_gib: float = 0.0  # CPU offload's host RAM on one node: per worker x workers on the node

    def fits(self, budget: Budget) -> bool:
        return self.peak_gib <= budget.usable_gib and self.host_node_gib <= budget.host_usable_gib

    def why_not(self, budget: Budget) -> str:
        if self.peak_gib > budget.usable_gib:
            return f"peak {gib(self.peak_gib)} > budget {gib(budget.usable_gib)}"
        return (f"CPU offload needs {gib(self.host_node_gib)} of host RAM per node > "
                f"{gib(budget.host_usable_gib)} usable")

    @property
    def peak_gib(self) -> float:
        return self.est.peak_gib

    def knobs(self) -> dict[str, Any]:
        s = self.setup
        return {"method": s.method, "micro_batch": s.micro_batch, "grad_accum": s.grad_accum,
                "ckpt_fraction": s.ckpt_fraction, "fused_ce": s.fused_ce, "fused_kernels": s.fused_kernels,
                "zero_stage": s.zero, "offload": s.offload}

    def label(self) -> str:
        s = self.setup
        ck = {0.0: "no ckpt", 1.0: "full ckpt"}.get(s.ckpt_fraction, f"ckpt {s.ckpt_fraction:.0%}")
        zero = f"ZeRO-{s.zero}" + ("" if s.offload == "none" else f"+offload {s.offload}")
        return (f"{s.method} mb {s.micro_batch}x{s.grad_accum}, {ck}, {'fused CE' if s.fused_ce else 'HF loss'}, "
                f"{'fused layer ops, ' if s.fused_kernels else ''}{zero}")


COMPILE_MIN_STEPS = 50


def liger_available() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def compiles(cfg: StageConfig, use_gpu: bool, method: str, zero: int) -> bool:
    """Whether the decoder layers are compiled (stages/speed.py). Automatic only where it was measured:
    GPU runs with bf16 LoRA or full weights; 4-bit layers and ZeRO-3's parameter hooks are left eager. A
    stage capped below COMPILE_MIN_STEPS steps stays eager too: compiling costs each worker 20-60 s first."""
    if cfg.compile != "auto":
        return bool(cfg.compile)
    short = 0 < cfg.max_steps < COMPILE_MIN_STEPS
    return use_gpu and method != "qlora" and zero != 3 and not short


def _divisors(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def _micro_options(stage: str, cfg: StageConfig, per_worker: int, lengths: LengthProfile | None,
                   reasons: list[str], note: Any) -> tuple[list[int], int]:
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


def _options(stage: str, cfg: StageConfig, shape: ModelShape, num_workers: int, use_gpu: bool,
             reasons: list[str], lengths: LengthProfile | None = None) -> dict[str, list[Any]]:
    """The values each knob may take: the explicit one, or the searched set, each with its reason."""
    where = f"stages.{stage}"
    model = stage_kind(stage).memory_kind  # the built-in kind whose trainer and memory model it follows

    def note(key: str, value: Any, searched: list[Any], why: str) -> list[Any]:
        if value == "auto":
            reasons.append(f"{key}: searched {searched} ({why})")
            return searched
        reasons.append(f"{key}: {value} (explicit)")
        return [value]

    methods = note("method", cfg.method, ["lora", "qlora"] if use_gpu else ["lora"],
                   "LoRA or QLoRA; full only when asked" if use_gpu else "QLoRA needs a GPU")
    if "qlora" in methods and not use_gpu:
        raise ConfigError(f"{where}.method: 'qlora' needs GPUs (bitsandbytes 4-bit); resources.use_gpu is false")
    if cfg.precision != "auto" and cfg.precision != "fp32" and not use_gpu:
        raise ConfigError(f"{where}.precision: '{cfg.precision}' needs GPUs; use 'fp32' (or auto) on CPU")

    per_worker, rem = divmod(cfg.effective_batch, num_workers)
    if rem or per_worker == 0:
        raise ConfigError(f"{where}.effective_batch: {cfg.effective_batch} is not a multiple of the {num_workers} "
                          f"data-parallel workers")
    if cfg.micro_batch != "auto" and per_worker % cfg.micro_batch:
        raise ConfigError(f"{where}.micro_batch: {cfg.micro_batch} does not divide the per-worker batch {per_worker} "
                          f"(effective_batch {cfg.effective_batch} / {num_workers} workers)")
    micro, per_worker = _micro_options(stage, cfg, per_worker, lengths, reasons, note)
    step = max(1, shape.layers // CKPT_STEPS)
    fractions = sorted({k / shape.layers for k in [*range(0, shape.layers + 1, step), shape.layers]})
    if cfg.grad_ckpt == "auto":
        ckpt = note("grad_ckpt", "auto", [round(f, 3) for f in fractions], "share of layers recomputing")
    else:
        value = 1.0 if cfg.grad_ckpt is True else 0.0 if cfg.grad_ckpt is False else float(cfg.grad_ckpt)
        ckpt = note("grad_ckpt", value, [], "")

    fused_auto = {"pt": [False, True] if (use_gpu and liger_available()) else [False], "sft": [True],
                  "dpo": [True], "rm": [False], "orpo": [False], "kto": [True], "grpo": [True]}[model]
    if cfg.fused_ce != "auto":
        if model in ("sft", "dpo", "kto", "grpo") and not cfg.fused_ce:
            raise ConfigError(f"{where}.fused_ce: false is not available: TRL computes the {stage} loss with its "
                              f"chunked LM head (no full logits) in every run")
        if model == "rm" and cfg.fused_ce:
            raise ConfigError(f"{where}.fused_ce: the reward model has a 1-wide score head, no vocabulary loss")
        if model == "orpo" and cfg.fused_ce:
            raise ConfigError(f"{where}.fused_ce: TRL's ORPO and CPO trainers compute the full logits; no fused "
                              f"cross-entropy is available for {stage}")
        if model == "pt" and cfg.fused_ce and not use_gpu:
            raise ConfigError(f"{where}.fused_ce: Liger's fused linear cross-entropy needs a GPU")
        if model == "pt" and cfg.fused_ce and not liger_available():
            raise ConfigError(f"{where}.fused_ce: needs liger-kernel: pip install 'medgpt-ray[gpu]'")
    why_fused = ("Liger fused linear CE" + ("" if liger_available() else " unavailable: liger-kernel not installed")
                 if model == "pt" else "fixed by the trainer")
    fused = note("fused_ce", cfg.fused_ce, fused_auto, why_fused)

    fusable = use_gpu and (liger_available() or cfg.compile is not False)
    if cfg.fused_kernels is True:
        if model == "rm":
            raise ConfigError(f"{where}.fused_kernels: fused layer kernels are applied to the causal-LM stages "
                              f"(pt, sft, dpo), not the reward model")
        if not fusable:
            raise ConfigError(f"{where}.fused_kernels: fused layer kernels need a GPU and either compile "
                              f"(not false) or liger-kernel (pip install 'medgpt-ray[gpu]')")
    kernels_auto = [False, True] if (fusable and model != "rm") else [False]
    kernels = note("fused_kernels", cfg.fused_kernels, kernels_auto,
                   "fused RMSNorm/SwiGLU/RoPE: compiled layers, else Liger"
                   + ("" if liger_available() else " (liger-kernel not installed)"))

    optim = note("optim", cfg.optim, ["adamw"], "AdamW")
    if optim == ["adamw-8bit"] and not use_gpu:
        raise ConfigError(f"{where}.optim: 'adamw-8bit' needs a GPU (bitsandbytes)")

    zero_pairs = _zero_options(stage, cfg, methods, num_workers, use_gpu)
    reasons.append(f"zero_stage/offload: {'searched ' if len(zero_pairs) > 1 else ''}"
                   f"{[f'{z}/{o}' for z, o in zero_pairs]}")
    return {"method": methods, "micro": micro, "ckpt": ckpt, "fused": fused, "kernels": kernels, "optim": optim,
            "zero": zero_pairs, "per_worker": [per_worker]}


def _zero_options(stage: str, cfg: StageConfig, methods: list[str], num_workers: int,
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


def _setups(stage: str, cfg: StageConfig, opts: dict[str, list[Any]], num_workers: int, use_gpu: bool,
            seq_len: int, packed: bool):
    per_worker = opts["per_worker"][0]
    for method, micro, ck, fused, kernels, optim, (zero, offload) in itertools.product(
            opts["method"], opts["micro"], opts["ckpt"], opts["fused"], opts["kernels"], opts["optim"],
            opts["zero"]):
        precision = cfg.precision if cfg.precision != "auto" else (
            "fp32" if not use_gpu else "amp-bf16" if method == "full" else "bf16")
        if method == "qlora" and zero == 3:
            continue
        if kernels and not (compiles(cfg, use_gpu, method, zero) or liger_available()):
            continue  # nothing would fuse the layer ops this estimate assumes fused
        yield from generation_choices(replace(TrainSetup(
            stage=stage_kind(stage).memory_kind, method=method, precision=precision, micro_batch=micro,
            seq_len=seq_len, ckpt_fraction=ck, fused_ce=fused, zero=zero, offload=offload, gpus=num_workers,
            optim=optim, lora_rank=cfg.lora.rank, grad_accum=per_worker // micro, fused_kernels=kernels,
            compiled=compiles(cfg, use_gpu, method, zero), packed=packed), **setup_fields(cfg, stage, use_gpu)),
            getattr(cfg, "num_generations", 0))


def _candidate(shape: ModelShape, setup: TrainSetup, budget: Budget) -> Candidate:
    est = estimate(shape, setup)
    return Candidate(setup, est, tokens_per_second(shape, setup, budget.gpu),
                     est.host_gib * budget.workers_per_node(setup.gpus))


def _explain_no_fit(stage: str, cfg: StageConfig, shape: ModelShape, cands: list[Candidate], budget: Budget,
                    explicit: list[str]) -> str:
    best = min(cands, key=lambda c: c.peak_gib)
    lines = [f"stages.{stage}: nothing fits {budget.describe()}.",
             f"  smallest predicted peak: {gib(best.peak_gib)} with {best.label()}"]
    host_bound = [c for c in cands if c.peak_gib <= budget.usable_gib]
    if host_bound:
        least = min(host_bound, key=lambda c: c.host_node_gib)
        lines.append(f"  {len(host_bound)} configuration(s) fit the GPU only with CPU offload, which needs at least "
                     f"{gib(least.host_node_gib)} of host RAM per node ({least.label()}) > "
                     f"{gib(budget.host_usable_gib)} usable: add RAM or set resources.host_memory_gib if it is "
                     f"more than was read")
    if explicit:
        lines.append(f"  fixed by the config: {', '.join(explicit)}")
    smallest = 1 if cfg.min_micro_batch == 1 else min(c.setup.micro_batch for c in cands)  # kto: at least 2
    s0 = replace(best.setup, micro_batch=smallest, ckpt_fraction=1.0)
    usable = budget.usable_gib

    def option(label: str, setup: TrainSetup) -> str:
        c = _candidate(shape, setup, budget)
        return (f"{label}: {gib(c.peak_gib)}{f' + {gib(c.host_node_gib)} host RAM/node' if c.host_node_gib else ''} "
                f"({'fits' if c.fits(budget) else 'still over'})")

    hints = rl_hints(shape, best.setup, usable)  # grpo, rloo: fewer generations, shorter completions, QLoRA, ...
    if s0.method != "qlora" and budget.gpu_gib is not None and not best.setup.generations:  # QLoRA needs a GPU
        hints.append(option("method qlora", replace(s0, method="qlora", precision="bf16", zero=0, offload="none")))
    for seq in (cfg.seq_len // 2, cfg.seq_len // 4, cfg.seq_len // 8):
        if seq >= 64 and estimate(shape, replace(s0, seq_len=seq)).peak_gib <= usable:
            hints.append(option(f"seq_len {seq}", replace(s0, seq_len=seq)))
            break
    if s0.method != "qlora":
        for n in (2, 4, 8, 16):
            if n > s0.gpus and estimate(shape, replace(s0, zero=3, offload="none", gpus=n)).peak_gib <= usable:
                hints.append(option(f"{n} GPUs with ZeRO-3", replace(s0, zero=3, offload="none", gpus=n)))
                break
        if s0.method == "full":
            hints.append(option("ZeRO-3 with parameter+optimizer offload", replace(s0, zero=3, offload="all")))
    if hints:
        lines.append(f"  other options at micro-batch {s0.micro_batch} with full checkpointing: " + "; ".join(hints))
    return "\n".join(lines)


def plan_stage(stage: str, cfg: StageConfig, num_workers: int, use_gpu: bool, shape: ModelShape | None = None,
               budget: Budget | None = None, lengths: LengthProfile | None = None) -> StagePlan:
    """The fastest configuration predicted to fit; `lengths` (the train data's, stages/length_profile.py) plans
    at the data's real lengths, without it at rows of seq_len."""
    shape = shape or load_shape("tiny")
    budget = budget or make_budget(None, 0.0, "auto", use_gpu, "none")
    reasons: list[str] = [f"budget: {budget.describe()}"]
    opts = _options(stage, cfg, shape, num_workers, use_gpu, reasons, lengths)
    seq_len = planned_seq_len(stage, cfg, lengths, reasons)
    cands = []
    for setup in _setups(stage, cfg, opts, num_workers, use_gpu, seq_len, packs(stage, cfg, lengths)):
        try:
            cands.append(_candidate(shape, setup, budget))
        except SetupError:
            continue
    if not cands:
        raise PlanError(f"stages.{stage}: the explicit settings leave no valid configuration")
    fits = [c for c in cands if c.fits(budget)]
    explicit = [f"{k}={v}" for k, v in (("method", cfg.method), ("micro_batch", cfg.micro_batch),
                                        ("grad_ckpt", cfg.grad_ckpt), ("zero_stage", cfg.zero_stage),
                                        ("offload", cfg.offload), ("seq_len", cfg.seq_len)) if v != "auto"]
    if not fits:
        err = PlanError(_explain_no_fit(stage, cfg, shape, cands, budget, explicit))
        err.smallest_peak_gib = min(c.peak_gib for c in cands)
        raise err
    # Fastest first; among equals, the one with more headroom.
    chosen = max(fits, key=lambda c: (round(c.tokens_per_s, 6), -c.peak_gib))
    s = chosen.setup
    plan = StagePlan(stage, s.method, s.precision, s.micro_batch, s.grad_accum, num_workers, use_gpu,
                     s.ckpt_fraction, s.fused_ce, s.optim, s.zero, s.offload, None, reasons)
    plan.fused_kernels = s.fused_kernels
    plan.seq_len_planned = seq_len
    if lengths is not None:
        plan.lengths = lengths.to_dict()
    if packs(stage, cfg, lengths):
        plan.packing = {"rows_per_step": opts["per_worker"][0],
                        "conversations_per_step": cfg.effective_batch // num_workers,
                        "conversations_per_row": lengths.conversations_per_row if lengths else None}
    plan.compile, plan.steps_per_generation = compiles(cfg, use_gpu, s.method, s.zero), s.gen_steps or None
    try:
        plan.reward_model_on = reward_model_placement(shape, s, cfg, use_gpu, budget.usable_gib)
    except ValueError as e:
        raise PlanError(f"stages.{stage}.{e}") from None
    reasons.append(f"compile: {plan.compile} (" + ("explicit" if cfg.compile != "auto" else
                   f"auto: GPU runs except QLoRA, ZeRO-3 and max_steps < {COMPILE_MIN_STEPS}") + ")")
    plan.deepspeed = deepspeed_config(plan, cfg)
    offload = bool(chosen.host_node_gib)
    plan.prediction = Prediction(
        model=shape.name, peak_gib=round(chosen.peak_gib, 3), moment=chosen.est.moment,
        budget_gib=None if budget.gpu_gib is None else round(budget.usable_gib, 3),
        gpu_memory_gib=budget.gpu_gib, margin_gib=budget.margin_gib, budget_source=budget.source,
        gpu=budget.gpu.name, tokens_per_s_per_gpu=round(chosen.tokens_per_s, 1),
        breakdown_gib=chosen.est.breakdown_gib(), candidates=len(cands), fitting=len(fits),
        host_offload_gib_per_node=round(chosen.host_node_gib, 2) if offload else None,
        host_usable_gib=round(budget.host_usable_gib, 2) if offload and budget.host_gib is not None else None)
    plan.alternatives = _alternatives(chosen, cands, budget)
    reasons.append(f"chosen: {chosen.label()} (peak {chosen.peak_gib:.1f} GiB, "
                   f"{chosen.tokens_per_s:,.0f} tokens/s/GPU predicted)")
    return plan


def _alternatives(chosen: Candidate, cands: list[Candidate], budget: Budget, n: int = 3) -> list[dict[str, Any]]:
    """The faster configurations that did not fit, then the next best that did, with why."""
    out: list[dict[str, Any]] = []
    faster = sorted((c for c in cands if c.tokens_per_s > chosen.tokens_per_s * 1.0001),
                    key=lambda c: (-c.tokens_per_s, c.peak_gib))
    for c in faster[:n]:
        out.append({**c.knobs(), "peak_gib": round(c.peak_gib, 2),
                    "relative_speed": round(c.tokens_per_s / chosen.tokens_per_s, 3),
                    "why": c.why_not(budget)})
    slower = sorted((c for c in cands if c.fits(budget) and c is not chosen
                     and c.tokens_per_s <= chosen.tokens_per_s), key=lambda c: -c.tokens_per_s)
    for c in slower[:2]:
        rel = c.tokens_per_s / chosen.tokens_per_s
        out.append({**c.knobs(), "peak_gib": round(c.peak_gib, 2), "relative_speed": round(rel, 3),
                    "why": f"fits, predicted {100 * (1 - rel):.0f}% slower"})
    return out


# ---- every stage of a pipeline config ---------------------------------------------------------------------


def model_shape(cfg: PipelineConfig) -> ModelShape:
    path = cfg.model.path
    if path == "tiny" or (Path(path).expanduser() / "config.json").is_file():
        return load_shape(path)
    if cfg.model.shape:
        try:
            return load_shape(cfg.model.shape)
        except ShapeError as e:
            raise ConfigError(f"model.shape: {e}") from None
    raise ConfigError(f"model.path '{path}' has no config.json here to plan memory from; set model.shape to a "
                      f"preset (e.g. qwen2.5-7b) to plan on a machine without the model")


def plan_all(cfg: PipelineConfig, probe: GpuProbe | None = None, default_gpu_gib: float | None = None,
             budget: Budget | None = None) -> tuple[dict[str, StagePlan], dict[str, str]]:
    """Plans for the enabled stages, and for each stage that cannot be planned, the message why."""
    shape = model_shape(cfg)
    budget = budget or resolve_budget(cfg, probe, default_gpu_gib)
    plans: dict[str, StagePlan] = {}
    errors: dict[str, str] = {}
    for stage in cfg.enabled_stages():
        try:
            plans[stage] = plan_stage(stage, cfg.stages.get(stage), cfg.workers_for(stage), cfg.resources.use_gpu,
                                      shape, budget)
        except PlanError as e:
            errors[stage] = str(e)
    return plans, errors
