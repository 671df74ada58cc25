"""The dpo kind's config: TRL's DPOTrainer on preference pairs (data.preference), from sft's model, against a
reference. Sits with config/ (docs/ARCHITECTURE.md, "The stage-kind contract"); registered here, imported by
config/__init__ in pipeline order."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from medgpt_ray.config.preference import IMPLICIT_REWARD
from medgpt_ray.config.registry import StageKind, register_stage_kind
from medgpt_ray.config.stage import LengthGroupedStageConfig

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


register_stage_kind(StageKind("dpo", DPOStageConfig, "preference", "sft", {"lr": 5e-6},
                              pair_accuracy=IMPLICIT_REWARD, measures="pairs"))
