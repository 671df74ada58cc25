"""StagePlan: every knob of one stage made concrete, and the DeepSpeed dict that goes with it.

The planner (planner.py) fills it; the stages read it; it is saved as plan.json
beside every stage's outputs, with the prediction it was chosen on and any OOM
back-offs that happened while it ran.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from medgpt_ray.config import ConfigError, StageConfig, stage_kind
from medgpt_ray.memory.estimator import TrainSetup
from medgpt_ray.memory.lengths import packed_width
from medgpt_ray.memory.profiles import setup_fields, stage_profile
from medgpt_ray.memory.zero3 import MAX_LIVE_ELEMENTS, PERSISTENCE_THRESHOLD, PREFETCH_BUCKET_ELEMENTS
from medgpt_ray.placement.device import StagePlacement


@dataclass(frozen=True)
class Prediction:
    """What the planner predicted for the chosen configuration, and the per-GPU budget it was chosen for."""

    model: str
    peak_gib: float
    moment: str  # when the peak happens: "backward start" or "optimizer step"
    budget_gib: float | None  # usable per GPU: gpu_memory_gib - margin_gib; None: no GPU memory limit (CPU)
    gpu_memory_gib: float | None  # resources.gpu_memory_gib, or what was read on the GPU
    margin_gib: float
    budget_source: str
    gpu: str  # the GPU spec the throughput is predicted for
    tokens_per_s_per_gpu: float
    breakdown_gib: dict[str, float]
    candidates: int
    fitting: int
    host_offload_gib_per_node: float | None = None  # CPU offload's host RAM, when the plan offloads
    host_usable_gib: float | None = None


@dataclass(frozen=True)
class StagePlan:
    stage: str
    method: str
    precision: str
    micro_batch: int
    grad_accum: int
    num_workers: int
    use_gpu: bool
    ckpt_fraction: float  # share of decoder layers that recompute activations: 0 none, 1 full
    fused_ce: bool
    optim: str  # adamw | adamw-8bit
    zero_stage: int
    offload: str
    deepspeed: dict[str, Any] | None
    reasons: list[str] = field(default_factory=list)
    prediction: Prediction | None = None
    alternatives: list[dict[str, Any]] = field(default_factory=list)  # best rejected, with why
    backoffs: list[dict[str, Any]] = field(default_factory=list)  # OOM back-offs while running
    fused_kernels: bool = False  # fused RMSNorm/SwiGLU/RoPE: compiled layers when `compile`, else Liger's
    compile: bool = False  # decoder layers compiled in place (stages/speed.py)
    placement: StagePlacement | None = None  # GPUs per node, cost, runner-up, NCCL env (GPU stages)
    seq_len_planned: int | None = None  # the sequence length memory was planned at (memory/lengths.py)
    lengths: dict[str, Any] | None = None  # the train data's LengthProfile the plan used; None: not read
    # Packed (sft, rm): micro_batch and grad_accum count packed rows; {rows_per_step, conversations_per_step,
    # conversations_per_row}, where rm's "conversations" are pairs. None: micro_batch and grad_accum count examples.
    packing: dict[str, Any] | None = None
    # A packed plan whose worker could not pack, trained padded by length (trainer_kit/length_bins.py): micro_batch
    # and grad_accum count bins of up to bin_tokens padded tokens; {bin_tokens, bins_per_step, examples_per_bin,
    # sequences_per_example (rm's pairs: 2), conversations_per_step (rm: pairs)}. None: not binned.
    length_bins: dict[str, Any] | None = None
    # GRPO: micro-batches per generate call (TRL's steps_per_generation; generation batch = micro_batch x this,
    # completions per worker). None: the kind does not generate, or one call per optimizer step.
    steps_per_generation: int | None = None
    # A stage with a reward model (rloo; grpo's reward_model reward): which device holds it and its size, or that
    # it is an adapter on the policy's own base (reward_shared_base).
    reward_model_on: str | None = None
    # reward_model_gpu stages: the physical GPU (PCI bus order) the placement gave the reward model's actor.
    reward_model_gpu: int | None = None
    # A stage that generates: what its rollouts decode with (memory/generation.py rollout_path). None: no rollouts.
    rollout: str | None = None
    # A stage that generates: its decode path, dynamic or static (memory/generation.py decode_path; the reason is in
    # `rollout`). None: no rollouts.
    generation_path: str | None = None
    # A hybrid model (linear-attention layers): the kernels its training steps run those layers on, and why
    # (memory/plan_build.linear_attention_line). None: no linear-attention layers.
    linear_attention: str | None = None
    # Online-RL stages with reward_clip_range: {min, max, applied_to} (config/online_rl.py reward_clip); None: none.
    reward_clip: dict[str, Any] | None = None
    # sft's attention kernel when it is not the model's SDPA: "flex" (trainer_kit/packed_attention.use_attention).
    # None: SDPA, as the model loads.
    attention: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """What plan.json holds (run/job.write_plan, its one writer, writes it)."""
        d = asdict(self)
        d["placement"] = None if self.placement is None else self.placement.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StagePlan:
        d = dict(d)
        d["prediction"] = None if d.get("prediction") is None else Prediction(**d["prediction"])
        d["placement"] = None if d.get("placement") is None else StagePlacement.from_dict(d["placement"])
        return cls(**d)

    @property
    def examples_per_step(self) -> int:
        """The global batch in examples (pretraining blocks, conversations, preference pairs): what
        `effective_batch` asks for, whatever the memory layout (micro-batch x accumulation x workers)."""
        return self.per_worker_examples * self.num_workers

    @property
    def per_worker_examples(self) -> int:
        """Examples per worker per step: conversations when packed (the rows hold about that many)."""
        if self.packing is not None:
            return int(self.packing["conversations_per_step"])
        if self.length_bins is not None:
            return int(self.length_bins["conversations_per_step"])
        return self.micro_batch * self.grad_accum

    def train_setup(self, cfg: StageConfig) -> TrainSetup:
        """The setup the estimator and the throughput model score: this plan's knobs with the sequence length it
        was planned at (the data's, memory/lengths.py; else the stage's seq_len) and the stage's LoRA rank (the one
        way from a plan to a TrainSetup)."""
        return replace(TrainSetup(
            stage=stage_kind(self.stage).memory_kind, method=self.method, precision=self.precision,
            micro_batch=self.micro_batch, seq_len=self.seq_len_planned or cfg.seq_len,
            ckpt_fraction=self.ckpt_fraction, fused_ce=self.fused_ce, zero=self.zero_stage,
            offload=self.offload, gpus=self.num_workers, optim=self.optim, lora_rank=cfg.lora.rank,
            lora_experts=cfg.lora.experts,
            grad_accum=self.grad_accum, fused_kernels=self.fused_kernels, compiled=self.compile,
            packed=self.packing is not None, gen_steps=self.steps_per_generation or 0),
            **setup_fields(self.stage, cfg, self.use_gpu))

    def identity(self) -> dict[str, Any]:
        """What decides what the stage trains (for fingerprints). Memory knobs do not: micro-batch vs
        accumulation, checkpointing, fused CE, ZeRO and offload compute the same updates, so a finished stage
        is not retrained because the planner (or an OOM back-off) chose another memory layout."""
        return {"stage": self.stage, "method": self.method, "precision": self.precision, "optim": self.optim,
                "num_workers": self.num_workers, "use_gpu": self.use_gpu,
                "per_worker_batch": self.per_worker_examples}


def deepspeed_config(plan: StagePlan, cfg: StageConfig) -> dict[str, Any] | None:
    """The DeepSpeed dict, with every value concrete (no "auto") and in agreement with TrainingArguments."""
    if plan.zero_stage == 0:
        return None
    zero: dict[str, Any] = {
        "stage": plan.zero_stage,
        "overlap_comm": plan.use_gpu,
        "contiguous_gradients": True,
        "reduce_bucket_size": 5e7,
    }
    if plan.zero_stage == 3:  # the values memory/zero3.py replays to count the gathered parameters
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        zero["stage3_prefetch_bucket_size"] = float(PREFETCH_BUCKET_ELEMENTS)
        zero["stage3_param_persistence_threshold"] = float(PERSISTENCE_THRESHOLD)
        zero["stage3_max_live_parameters"] = float(MAX_LIVE_ELEMENTS)
    if plan.offload in ("optimizer", "all"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": plan.use_gpu}
    if plan.offload == "all":
        if plan.zero_stage != 3:
            raise ConfigError(f"stages.{plan.stage}.offload: 'all' (parameter offload) needs zero_stage 3")
        zero["offload_param"] = {"device": "cpu", "pin_memory": plan.use_gpu}
    return {
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "train_batch_size": plan.micro_batch * plan.grad_accum * plan.num_workers,
        "gradient_clipping": cfg.max_grad_norm,
        "bf16": {"enabled": plan.precision in ("bf16", "amp-bf16")},
        "fp16": {"enabled": False},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def halve_micro_batch(plan: StagePlan, cfg: StageConfig, reason: str, step: int | None) -> StagePlan | None:
    """OOM back-off: a new plan with half the micro-batch and twice the accumulation (same effective batch), never
    below the kind's smallest micro-batch (`cfg.min_micro_batch`: kto's is 2). None when there is nothing left to
    give (the smallest micro-batch with full checkpointing)."""
    floor = cfg.min_micro_batch
    # The largest divisor of the micro-batch up to its half (and not below the floor) keeps micro x accumulation.
    smaller = max((d for d in range(floor, plan.micro_batch // 2 + 1) if plan.micro_batch % d == 0), default=None)
    if smaller is None and plan.ckpt_fraction >= 1:
        return None
    before = {"micro_batch": plan.micro_batch, "grad_accum": plan.grad_accum, "ckpt_fraction": plan.ckpt_fraction}
    micro, accum, ckpt = plan.micro_batch, plan.grad_accum, plan.ckpt_fraction
    if smaller is not None:
        micro, accum = smaller, accum * (micro // smaller)
    else:
        ckpt = 1.0  # the smallest micro-batch already: recompute every layer
    after = {"micro_batch": micro, "grad_accum": accum, "ckpt_fraction": ckpt}
    new = replace(plan, **after, backoffs=[*plan.backoffs, {"after_step": step, "reason": reason, "before": before,
                                                            "after": after}])
    return replace(new, deepspeed=deepspeed_config(new, cfg))


def packed_rows(plan: StagePlan, cfg: StageConfig, rows_per_step: int, conversations_per_row: float) -> StagePlan:
    """Packing (sft; rm, its pairs for conversations) sized on the worker (a plan made without the data's lengths):
    the plan with each worker's step in `rows_per_step` packed rows (stages/packing.py sizes it so a step holds
    about the planned conversations). The micro-batch is the largest divisor of rows_per_step up to the planned one:
    at most that many rows (sft: sequences of seq_len, rm: pairs at 2 x seq_len) is what the estimate was made for.
    The rows per step do not depend on the split, so an OOM back-off (half the planned micro-batch) trains the same
    rows in each step."""
    micro = max(d for d in range(1, min(rows_per_step, plan.micro_batch) + 1) if rows_per_step % d == 0)
    new = replace(plan, micro_batch=micro, grad_accum=rows_per_step // micro, packing={
        "rows_per_step": rows_per_step, "conversations_per_step": plan.per_worker_examples,
        "conversations_per_row": round(conversations_per_row, 3)})
    return replace(new, deepspeed=deepspeed_config(new, cfg))


def bin_shape(plan: StagePlan, cfg: StageConfig) -> tuple[int, int]:
    """(bin_tokens, sequences an example pads to) of a packed plan trained padded by length: a bin's budget is one
    packed row's width (seq_len; rm's pairs 2 x seq_len), and an example costs its sequences (rm scores chosen and
    rejected in one forward: 2) x its padded length. Why a bin needs no more memory than the row: the estimator
    prices a packed micro-batch of m rows as m x sequences_per_example x seq_len tokens (TrainSetup.tokens; for rm
    exactly m rows of reward_packing.row_width), plus a (width x width) mask per row; m bins padded by TRL's
    collators hold at most m x bin_tokens tokens, in sequences of at most seq_len that each attend only within
    themselves."""
    profile = stage_profile(plan.stage)
    return packed_width(plan.stage, plan.seq_len_planned or cfg.seq_len), profile.sequences_per_example


def binned(plan: StagePlan, cfg: StageConfig, examples_per_bin: float, asked: bool = False) -> StagePlan:
    """A plan made in packed rows (of conversations, or rm's pairs), for a worker whose model cannot pack (or, with
    `asked`, a stage set to `packing: by_length`): padded by length instead (trainer_kit/length_bins.py),
    each bin at most one packed row's tokens (bin_shape), so a micro-batch of as many bins as the plan had rows
    needs no more memory than they did (the same checkpointing); as many bins a step as hold about the planned
    examples, at `examples_per_bin` (the sample's, for bin_shape's numbers)."""
    if plan.packing is None:
        return plan
    per_worker = int(plan.packing["conversations_per_step"])
    bins = max(1, round(per_worker / max(examples_per_bin, 1e-9)))
    micro = max(d for d in range(1, min(bins, plan.micro_batch) + 1) if bins % d == 0)
    width, sequences = bin_shape(plan, cfg)
    unit = stage_profile(plan.stage).packed_unit
    cause = "by_length" if asked else "unavailable on the worker"
    new = replace(plan, micro_batch=micro, grad_accum=bins // micro, packing=None, length_bins={
        "bin_tokens": width, "bins_per_step": bins, "examples_per_bin": round(examples_per_bin, 3),
        "sequences_per_example": sequences, "conversations_per_step": per_worker},
        reasons=[*plan.reasons, f"packing: {cause}; padded by length: {bins} bins of up to "
                                f"{width} tokens a step ({examples_per_bin:.1f} {unit} a bin in the sample), "
                                f"{micro} a micro-batch"])
    return replace(new, deepspeed=deepspeed_config(new, cfg))


def keep_backoffs(plan: StagePlan, previous: StagePlan, cfg: StageConfig) -> StagePlan:
    """The plan an interrupted attempt resumes with: where its OOM back-offs left it (same per-worker batch only)."""
    if not previous.backoffs or previous.micro_batch * previous.grad_accum != plan.micro_batch * plan.grad_accum:
        return plan
    new = replace(plan, micro_batch=previous.micro_batch, grad_accum=previous.grad_accum,
                  ckpt_fraction=max(plan.ckpt_fraction, previous.ckpt_fraction), backoffs=list(previous.backoffs))
    return replace(new, deepspeed=deepspeed_config(new, cfg))
