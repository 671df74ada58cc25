"""The keys every stage kind has (StageConfig, with its field docs: docs/configs.md's key table is generated from them),
the ones of the kinds whose examples vary in length, and which keys a stage's fingerprint leaves out."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from medgpt_ray.config.base import Auto, LoraConfig, _Strict


class StageConfig(_Strict):
    """The keys every stage kind has (`stages.<kind>.<key>`); a kind's config class may add its own."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True,
                              use_attribute_docstrings=True)

    enabled: bool = True
    """false: the stage does not run; its dependants start from its input."""
    from_: str | None = Field(None, alias="from")
    """The stage whose model this one starts from; null: the kind's default (pt -> sft -> {rm, dpo}). A disabled
    one hands over its own input."""
    needs: list[str] = []
    """Stages whose outputs this one reads besides its `from` (e.g. an RL stage needs rm); each must be enabled."""
    method: Literal["auto", "full", "lora", "qlora"] = "auto"
    """auto: the planner picks LoRA or QLoRA (never full unless asked)."""
    lora: LoraConfig = LoraConfig()
    """LoRA/QLoRA adapter settings."""
    precision: Literal["auto", "fp32", "bf16", "amp-bf16"] = "auto"
    """bf16: weights held in bf16; amp-bf16: fp32 master weights with bf16 autocast; auto: fp32 on CPU, amp-bf16
    for full training, else bf16."""
    lr: Annotated[float, Field(gt=0)] = 2e-5
    """Peak learning rate (cosine schedule)."""
    epochs: Annotated[float, Field(gt=0)] = 1.0
    """Passes over the training split (unless max_steps)."""
    max_steps: Annotated[int, Field(ge=-1)] = -1
    """Optimizer steps; -1: run `epochs`; 0: no training: the stage passes its input model on, as a disabled one
    does, and the run says so (a stage that `needs` it is refused: it has no output)."""
    seq_len: Annotated[int, Field(ge=8)] = 1024
    """Tokens per sequence (pretraining block size); what happens to longer records: `overlong`."""
    micro_batch: Auto | Annotated[int, Field(ge=1)] = "auto"
    """Examples per worker per forward pass (packed SFT: at most this many packed rows); auto: the planner's choice.
    A memory knob (not in the fingerprint)."""
    effective_batch: Annotated[int, Field(ge=1)] = 16
    """Examples (blocks, conversations, pairs) per optimizer step, over all workers: micro x accumulation x
    workers (packed SFT: the packed rows that hold about this many conversations)."""
    grad_ckpt: Auto | bool | Annotated[float, Field(gt=0, lt=1)] = "auto"
    """Activation checkpointing: true every decoder layer recomputes its activations, false none, a fraction in
    (0, 1) that share of the layers (the first ones). A memory knob."""
    fused_ce: Auto | bool = "auto"
    """Fused linear cross-entropy (no b x s x vocab logits). pt: Liger's kernel (GPU, gpu extra); sft and dpo:
    TRL's chunked LM head, always on; rm has no vocabulary head. A memory knob."""
    fused_kernels: Auto | bool = "auto"
    """Fused RMSNorm, SwiGLU and RoPE (GPU; pt, sft, dpo): from the compiled layers when `compile` is on, else
    Liger's Triton kernels (gpu extra). A memory knob."""
    compile: Auto | bool = "auto"
    """Compile each decoder layer in place with torch.compile. auto: on GPU, except QLoRA, ZeRO-3 and stages
    capped below 50 steps (compiling costs each worker 20-60 s). A memory knob."""
    optim: Literal["auto", "adamw", "adamw-8bit"] = "auto"
    """Optimizer; adamw-8bit needs a GPU (bitsandbytes)."""
    zero_stage: Auto | Literal[0, 1, 2, 3] = "auto"
    """DeepSpeed ZeRO stage (0: none); the planner emits the DeepSpeed config. A memory knob."""
    offload: Literal["auto", "none", "optimizer", "all"] = "auto"
    """ZeRO CPU offload: optimizer states, or all (parameters too, ZeRO-3). A memory knob."""
    warmup_ratio: Annotated[float, Field(ge=0, lt=1)] = 0.03
    """Share of the steps spent warming the learning rate up."""
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    """AdamW weight decay."""
    max_grad_norm: Annotated[float, Field(gt=0)] = 1.0
    """Gradient clipping norm."""
    save_steps: Annotated[int, Field(ge=1)] = 200
    """Checkpoint every this many steps (an interrupted stage resumes from the newest)."""
    eval_steps: Annotated[int, Field(ge=1)] | None = None
    """Evaluate the held-out split every this many steps; null: once at the end. A sweep's ASHA needs it."""
    logging_steps: Annotated[int, Field(ge=1)] = 10
    """Log (metrics.jsonl, progress, Prometheus) every this many steps."""
    report_to: Literal["none", "tensorboard"] | None = None
    """tensorboard: rank 0 also writes TensorBoard event files to runs/<name>/<stage>/tb/ (the Prometheus metric
    names); none: it does not; null: the top-level `report_to`. Not in the fingerprint."""
    template: str | None = None
    """Chat template (see model.template); null: model.template."""
    num_workers: Annotated[int, Field(ge=1)] | None = None
    """Data-parallel workers; null: resources.num_workers."""
    placement: Literal["auto"] | list[Annotated[int, Field(ge=0)]] = "auto"
    """GPUs by PCIe topology (medgpt_ray/placement/policy.py), or an explicit list of GPU indices on each node
    (PCI bus order, as nvidia-smi numbers them), checked against the node's topology."""

    @property
    def min_micro_batch(self) -> int:
        """The smallest micro-batch the kind's trainer takes (the planner and the OOM back-off stop there)."""
        return 1

    @property
    def reward_clip(self) -> dict[str, Any] | None:
        """Reward clipping as plan.json shows it: the range and where it applies (the online-RL kinds',
        config/online_rl.py); None for a kind without rewards or without clipping."""
        return None

    def training_identity(self) -> dict[str, Any]:
        """The config as a stage fingerprint sees it: what decides the updates the stage computes.

        Left out: `enabled`, and the memory and placement knobs, explicit or `auto` (ARCHITECTURE.md): the
        micro-batch/accumulation split, checkpointing, fused CE and layer kernels, compiling, ZeRO, offload and
        the GPUs it runs on compute the same updates in another memory layout. The knobs the planner resolves
        that do change the updates (method, precision, optimizer, per-worker batch) enter the fingerprint as
        the plan resolved them (StagePlan.identity), so `auto` and its explicit resolution hash the same."""
        return self.model_dump(mode="json", exclude={"enabled", *NOT_IN_FINGERPRINT, *MEMORY_KNOBS,
                                                     *PLAN_RESOLVED_KNOBS})


# Planner knobs that change only how the same updates are laid out in memory, and where they run. `packing` and
# `group_by_length` are not (they change which examples share a step): they stay in the fingerprint.
MEMORY_KNOBS: frozenset[str] = frozenset(
    {"micro_batch", "grad_ckpt", "fused_ce", "fused_kernels", "compile", "zero_stage", "offload", "placement",
     "reward_model_gpu", "reward_shared_base", "attention"})
# What only changes what is logged, not what is trained.
NOT_IN_FINGERPRINT: frozenset[str] = frozenset({"report_to"})
# Planner knobs that change the updates: in a fingerprint through StagePlan.identity(), resolved.
PLAN_RESOLVED_KNOBS: frozenset[str] = frozenset({"method", "precision", "optim"})


class OverlongStageConfig(StageConfig):
    """A stage whose records can be longer than seq_len (every kind but pt, which packs its text into blocks)."""

    overlong: Literal["truncate", "skip"] = "truncate"
    """A record longer than seq_len: truncate (cut by the kind's rule) or skip (left out); counted either way in
    the stage's done line, summary.json and the report. The rule per kind: docs/data.md, "Records longer than
    seq_len"."""


def overlong_policy(cfg: StageConfig) -> str:
    """The stage's `overlong`; truncate for a config of a class without the key (a stage built by hand)."""
    return cfg.overlong if isinstance(cfg, OverlongStageConfig) else "truncate"


class LengthGroupedStageConfig(OverlongStageConfig):
    """A stage whose examples vary in length (conversations, pairs): the keys of its batching."""

    group_by_length: bool = True
    """Group examples of similar length into the same optimizer step, so micro-batches pad little: windows of 50
    steps of the shuffled epoch are sorted by length (a pair: prompt + its longer answer) and cut into steps, shuffled
    again (trainer_kit/shard_sampler.py). Any micro-batch x accumulation split (an OOM back-off) trains the same
    steps. In the fingerprint: it changes which examples share a step. Packed rows (sft, rm) ignore it."""

