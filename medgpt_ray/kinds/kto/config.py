"""The kto kind's config: TRL's KTOTrainer on unpaired examples (data.unpaired, and data.preference unpaired), from
sft's model. Sits with config/ (docs/ARCHITECTURE.md, "The stage-kind contract"); registered here, imported by
config/__init__ in pipeline order."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from medgpt_ray.config.registry import PairAccuracy, StageKind, register_stage_kind
from medgpt_ray.config.stage import LengthGroupedStageConfig

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


# Off unless enabled. Its held-out pairs are those of the unpaired split (a pair's halves split together, by the pair's
# id): drawn like, not identical to, the preference split's that the baselines read.
register_stage_kind(StageKind("kto", KTOStageConfig, "unpaired", "sft", {"enabled": False, "lr": 5e-6},
                              pair_accuracy=PairAccuracy("eval_reward_accuracy", "implicit reward beta*log(pi/pi_ref), "
                                                         "on the unpaired split's held-out pairs"),
                              measures="completions"))
