"""The preference kinds' config classes: the reward model (rm) and the policy methods on preference pairs (dpo, and
the reference-free orpo and simpo) or on unpaired examples (kto). Registered by config/stages.py."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from medgpt_ray.config.base import Auto
from medgpt_ray.config.stage import LengthGroupedStageConfig


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

