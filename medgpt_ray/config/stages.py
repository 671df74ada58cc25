"""The stages' config: the built-in training kinds registered in pipeline order (pt and sft here, the preference
kinds' classes from config/preference.py, the keys they share from config/stage.py), and the `stages:` section,
which validates each registered kind by its config class (ARCHITECTURE.md: a new kind is a module in stages/, a
config class and a registry entry)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from medgpt_ray.config.base import Auto, _NestedErrors
from medgpt_ray.config.preference import (
    DPOStageConfig,
    KTOStageConfig,
    ORPOStageConfig,
    RMStageConfig,
    SimPOStageConfig,
)
from medgpt_ray.config.registry import STAGE_KINDS, PairAccuracy, StageKind, register_stage_kind
from medgpt_ray.config.stage import LengthGroupedStageConfig, StageConfig


class SFTStageConfig(LengthGroupedStageConfig):
    packing: Auto | bool = "auto"
    """Pack the conversations into rows of `seq_len` tokens (best-fit decreasing), each conversation attending
    only to itself (position ids restart at every conversation); labels unchanged. auto: on where the model's
    attention keeps a row's conversations apart (SDPA and eager, checked on the loaded model; FlashAttention), off
    elsewhere; true there is an error. `effective_batch` still counts conversations: a step takes as many packed
    rows as hold about that many (the real count is logged as conversations_per_step). Not a memory knob: it
    changes which conversations share a step, so it is in the fingerprint."""


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

    model_config = ConfigDict(extra="allow", frozen=True)

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
