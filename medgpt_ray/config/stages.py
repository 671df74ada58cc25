"""The stages' config: a config class per stage kind with documented fields, and the registry of kinds
(ARCHITECTURE.md: a new kind is a module in stages/, a config class and a registry entry)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from medgpt_ray.config.base import Auto, LoraConfig, _NestedErrors, _Strict
from medgpt_ray.config.registry import STAGE_KINDS, PairAccuracy, StageKind, register_stage_kind


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
    """Optimizer steps; -1: run `epochs`."""
    seq_len: Annotated[int, Field(ge=8)] = 1024
    """Tokens per sequence (pretraining block size; longer conversations and pairs are left out and counted)."""
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
    """Chat template (chatml = qwen, llama3, vicuna, alpaca); null: model.template."""
    num_workers: Annotated[int, Field(ge=1)] | None = None
    """Data-parallel workers; null: resources.num_workers."""
    placement: Literal["auto"] | list[Annotated[int, Field(ge=0)]] = "auto"
    """GPUs by PCIe topology (medgpt_ray/placement/policy.py), or an explicit list of GPU indices on each node
    (PCI bus order, as nvidia-smi numbers them), checked against the node's topology."""

    @property
    def min_micro_batch(self) -> int:
        """The smallest micro-batch the kind's trainer takes (the planner and the OOM back-off stop there)."""
        return 1

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
     "reward_model_gpu", "reward_shared_base"})
# What only changes what is logged, not what is trained.
NOT_IN_FINGERPRINT: frozenset[str] = frozenset({"report_to"})
# Planner knobs that change the updates: in a fingerprint through StagePlan.identity(), resolved.
PLAN_RESOLVED_KNOBS: frozenset[str] = frozenset({"method", "precision", "optim"})


class LengthGroupedStageConfig(StageConfig):
    """A stage whose examples vary in length (conversations, pairs): the keys of its batching."""

    group_by_length: bool = True
    """Group examples of similar length into the same optimizer step, so micro-batches pad little: windows of 50
    steps of the shuffled epoch are sorted by length (a pair: prompt + its longer answer) and cut into steps, shuffled
    again (stages/sharding.py). Any micro-batch x accumulation split (an OOM back-off) trains the same steps. In the
    fingerprint: it changes which examples share a step. Packed rows (sft, rm) ignore it."""


class SFTStageConfig(LengthGroupedStageConfig):
    packing: Auto | bool = "auto"
    """Pack the conversations into rows of `seq_len` tokens (best-fit decreasing), each conversation attending
    only to itself (position ids restart at every conversation); labels unchanged. auto: on where the model's
    attention keeps a row's conversations apart (SDPA and eager, checked on the loaded model; FlashAttention), off
    elsewhere; true there is an error. `effective_batch` still counts conversations: a step takes as many packed
    rows as hold about that many (the real count is logged as conversations_per_step). Not a memory knob: it
    changes which conversations share a step, so it is in the fingerprint."""


class RMStageConfig(LengthGroupedStageConfig):
    """The reward model's keys: the shared ones, the length grouping (unpacked) and packing."""

    packing: Auto | bool = "auto"
    """Pack the pairs into rows of 2 x `seq_len` tokens (best-fit decreasing on a pair's two lengths; a pair's
    chosen and rejected sequences share a row), each sequence attending only to itself (position ids restart at
    every one) and scored at its last token, padding-free. auto: off (measured no faster than padded pairs under
    SDPA on the H200, slower on CPU; ~20 % less memory); true packs where the model's attention keeps a row's
    sequences apart (as for sft), and where it cannot is an error. `effective_batch` still
    counts pairs: a step takes as many packed rows as hold about that many (logged as pairs_per_step). Evaluation
    stays unpacked. Packed rows ignore group_by_length. In the fingerprint: it changes which pairs share a step."""

    center_rewards_coefficient: Annotated[float, Field(ge=0)] | None = None
    """Adds this x mean((chosen score + rejected score)^2) to the Bradley-Terry loss (TRL's RewardConfig key, Eisenstein
    et al. 2023; TRL suggests 0.01): scores centred on 0 per pair, the right answer above 0 and the wrong ones below,
    whatever the prompt. Without it only score differences within a pair are trained, and a policy rewarded by the
    model (rloo) can climb whatever score offsets an answer has across prompts instead of being right (the tiny
    toy's rm: configs/tiny-cpu-rl.yaml). null: off."""


# Every loss TRL 1.16's DPOTrainer implements (trl/trainer/dpo_trainer.py), and the ones that read label_smoothing.
DPOLoss = Literal["sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
                  "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm"]
LABEL_SMOOTHING_LOSSES = ("robust", "exo_pair", "aot", "aot_unpaired")


class DPOStageConfig(LengthGroupedStageConfig):
    beta: Annotated[float, Field(gt=0)] = 0.1
    """DPO's beta: how far the policy may move from the reference (IPO's tau)."""
    loss_type: DPOLoss | list[DPOLoss] = "sigmoid"
    """TRL's DPO loss: sigmoid (DPO), hinge (SLiC), ipo, exo_pair, nca_pair, robust, bco_pair, sppo_hard, aot,
    aot_unpaired, apo_zero, apo_down, discopop, sft, sigmoid_norm; a list combines several (MPO), weighted by
    `loss_weights`."""
    loss_weights: list[Annotated[float, Field(ge=0)]] | None = None
    """One weight per `loss_type` entry when it is a list; null: 1.0 each."""
    label_smoothing: Annotated[float, Field(ge=0, lt=0.5)] = 0.0
    """Probability that a pair's label is flipped (robust, aot, aot_unpaired) or EXO's epsilon (exo_pair, where it
    must be > 0; 1e-3 is the paper's value). An error with any other loss."""
    discopop_tau: Annotated[float, Field(gt=0)] = 0.05
    """DiscoPOP's temperature; only the discopop loss reads it."""
    precompute_ref_log_probs: bool = False
    """Score the reference once before training instead of a no-grad reference pass every step."""

    @model_validator(mode="after")
    def _loss_parameters(self) -> DPOStageConfig:
        losses = self.losses
        if len(set(losses)) != len(losses):
            raise ValueError(f"loss_type: {losses} names a loss twice")
        if self.loss_weights is not None and len(self.loss_weights) != len(losses):
            raise ValueError(f"loss_weights: {len(self.loss_weights)} weights for {len(losses)} loss type(s) "
                             f"{losses}")
        if self.label_smoothing and not set(losses) & set(LABEL_SMOOTHING_LOSSES):
            raise ValueError(f"label_smoothing: {self.label_smoothing} applies only to the "
                             f"{', '.join(LABEL_SMOOTHING_LOSSES)} losses, not {losses}")
        if "exo_pair" in losses and self.label_smoothing == 0:
            raise ValueError("label_smoothing: the exo_pair loss needs it > 0 (EXO's epsilon; the paper uses 1e-3)")
        if self.discopop_tau != 0.05 and "discopop" not in losses:
            raise ValueError(f"discopop_tau: only the discopop loss reads it, not {losses}")
        return self

    @property
    def losses(self) -> list[str]:
        return [self.loss_type] if isinstance(self.loss_type, str) else list(self.loss_type)


class ReferenceFreeStageConfig(LengthGroupedStageConfig):
    """The keys of the reference-free preference kinds (orpo, simpo)."""

    compile: Auto | bool = False
    """Compile each decoder layer in place. Off by default here: TRL's ORPO and CPO collators pad each micro-batch
    to its own longest pair (no length buckets), so compiled layers would recompile for new lengths."""


class ORPOStageConfig(ReferenceFreeStageConfig):
    beta: Annotated[float, Field(gt=0)] = 0.1
    """ORPO's lambda: the weight of the odds-ratio term beside the NLL of the chosen answer (no reference model)."""


class SimPOStageConfig(ReferenceFreeStageConfig):
    beta: Annotated[float, Field(gt=0)] = 2.0
    """SimPO's beta: the scale of the length-normalised log-probability reward (the paper uses 2.0-2.5)."""
    gamma: Annotated[float, Field(ge=0)] = 0.5
    """SimPO's target reward margin, as gamma/beta between chosen and rejected (TRL's simpo_gamma)."""
    cpo_alpha: Annotated[float, Field(ge=0)] = 0.0
    """Weight of the NLL of the chosen answer: 0 is SimPO, > 0 is CPO-SimPO."""


KTOLoss = Literal["kto", "apo_zero_unpaired"]


class KTOStageConfig(LengthGroupedStageConfig):
    """KTO on unpaired examples: data.unpaired's, and data.preference's pairs unpaired (chosen desirable, rejected
    undesirable)."""

    beta: Annotated[float, Field(gt=0)] = 0.1
    """KTO's beta: how far the policy may move from the reference (the scale of the implicit reward)."""
    loss_type: KTOLoss = "kto"
    """TRL's KTO loss: kto (the paper's, against a KL reference point estimated from mismatched prompt-completion
    pairs of each micro-batch, so a micro-batch holds at least 2 examples) or apo_zero_unpaired (no KL term)."""
    desirable_weight: Annotated[float, Field(gt=0)] = 1.0
    """Weight of the desirable examples' losses (to balance unequal numbers of desirable and undesirable ones)."""
    undesirable_weight: Annotated[float, Field(gt=0)] = 1.0
    """Weight of the undesirable examples' losses."""

    @property
    def kl_batch(self) -> bool:
        """The kto loss's KL term: a forward of mismatched completions by policy and reference in every step."""
        return self.loss_type == "kto"

    @property
    def min_micro_batch(self) -> int:
        """TRL's KTO loss estimates its KL term within a micro-batch and refuses one of a single example."""
        return 2 if self.kl_batch else 1

    @model_validator(mode="after")
    def _kl_needs_two(self) -> KTOStageConfig:
        if self.micro_batch != "auto" and self.micro_batch < self.min_micro_batch:
            raise ValueError(f"micro_batch: {self.micro_batch} is below 2: the kto loss estimates its KL term from "
                             f"the other examples of a micro-batch (TRL refuses 1); use 2 or more, or loss_type "
                             f"apo_zero_unpaired")
        return self


register_stage_kind(StageKind("pt", StageConfig, "pretrain", None, {"method": "full", "lr": 5e-5}))
register_stage_kind(StageKind("sft", SFTStageConfig, "sft", "pt"))
# TRL logs the chosen-first accuracy of DPO, ORPO and CPO (SimPO) as rewards/accuracies, the RewardTrainer as accuracy.
IMPLICIT_REWARD = PairAccuracy("eval_reward_accuracy", "implicit reward beta*log(pi/pi_ref)")
NORMALISED_LOGP = PairAccuracy("eval_reward_accuracy", "length-normalised log-probability")
register_stage_kind(StageKind("rm", RMStageConfig, "preference", "sft", {"lr": 1e-5},
                              pair_accuracy=PairAccuracy("eval_accuracy", "reward model score")))
register_stage_kind(StageKind("dpo", DPOStageConfig, "preference", "sft", {"lr": 5e-6},
                              pair_accuracy=IMPLICIT_REWARD))
# Reference-free preference methods, off unless enabled: on TRL's ORPO and CPO trainers (trl.experimental).
REFERENCE_FREE_DEFAULTS = {"enabled": False, "lr": 5e-6}
register_stage_kind(StageKind("orpo", ORPOStageConfig, "preference", "sft", REFERENCE_FREE_DEFAULTS,
                              memory_model="orpo", pair_accuracy=NORMALISED_LOGP))
register_stage_kind(StageKind("simpo", SimPOStageConfig, "preference", "sft", REFERENCE_FREE_DEFAULTS,
                              memory_model="orpo", pair_accuracy=NORMALISED_LOGP))
# KTO, off unless enabled: TRL's KTOTrainer on unpaired examples (data.unpaired, and data.preference unpaired).
# Its held-out pairs are those of the unpaired split (a pair's halves split together, by the pair's id): drawn like,
# not identical to, the preference split's that the baselines read.
register_stage_kind(StageKind("kto", KTOStageConfig, "unpaired", "sft", {"enabled": False, "lr": 5e-6},
                              pair_accuracy=PairAccuracy("eval_reward_accuracy", "implicit reward beta*log(pi/pi_ref), "
                                                         "on the unpaired split's held-out pairs")))
# The online-RL kinds (grpo, rloo) are registered by config/online_rl.py, which config/__init__ imports next.


class StagesConfig(BaseModel):
    """One entry per registered stage kind, validated by that kind's config class; a kind not given gets its
    defaults. An unknown kind is an error."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _by_kind(cls, data: Any) -> Any:
        if isinstance(data, StagesConfig):
            return data
        given = dict(data or {})
        unknown = [k for k in given if k not in STAGE_KINDS]
        if unknown:
            raise ValueError(f"unknown stage kind '{unknown[0]}' (registered: {', '.join(STAGE_KINDS)})")
        out = {}
        for name, kind in STAGE_KINDS.items():
            value = given.get(name, {})
            if isinstance(value, StageConfig):
                value = value.model_dump(by_alias=True, exclude_unset=True)
            try:
                out[name] = kind.config_class.model_validate({**kind.defaults, **value})
            except ValidationError as e:
                raise _NestedErrors([{**err, "loc": (name, *err["loc"])} for err in e.errors()]) from None
        return out

    def get(self, stage: str) -> StageConfig:
        return getattr(self, stage)

    def kinds(self) -> list[str]:
        return list(self.__pydantic_extra__ or {})
