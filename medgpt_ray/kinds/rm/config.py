"""The rm kind's config: the reward model, a sequence classifier trained on preference pairs (data.preference) with
TRL's RewardTrainer, from sft's model. Sits with config/ (docs/ARCHITECTURE.md, "The stage-kind contract");
registered here, imported by config/__init__ in pipeline order."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from medgpt_ray.config.base import Auto, ByLength
from medgpt_ray.config.registry import PairAccuracy, StageKind, register_stage_kind
from medgpt_ray.config.stage import LengthGroupedStageConfig


class RMStageConfig(LengthGroupedStageConfig):
    """The reward model's keys: the shared ones, the length grouping (unpacked) and packing."""

    packing: Auto | bool | ByLength = "auto"
    """Pack the pairs into rows of 2 x `seq_len` tokens (best-fit decreasing on a pair's two lengths; a pair's
    chosen and rejected sequences share a row), each sequence attending only to itself (position ids restart at
    every one) and scored at its last token, padding-free. auto: off (measured no faster than padded pairs under
    SDPA on the H200, slower on CPU; ~20 % less memory); true packs where the model's attention keeps a row's
    sequences apart (as for sft), and where it cannot is an error; by_length: never packed, pairs of similar length
    padded in bins of a packed row's tokens (as sft's by_length). `effective_batch` still
    counts pairs: a step takes as many packed rows as hold about that many (logged as pairs_per_step). Evaluation
    stays unpacked. Packed rows ignore group_by_length. In the fingerprint: it changes which pairs share a step."""

    center_rewards_coefficient: Annotated[float, Field(ge=0)] | None = None
    """Adds this x mean((chosen score + rejected score)^2) to the Bradley-Terry loss (TRL's RewardConfig key, Eisenstein
    et al. 2023; TRL suggests 0.01): scores centred on 0 per pair, the right answer above 0 and the wrong ones below,
    whatever the prompt. Without it only score differences within a pair are trained, and a policy rewarded by the
    model (rloo) can climb whatever score offsets an answer has across prompts instead of being right (the tiny
    toy's rm: configs/tiny-cpu-rl.yaml). null: off."""


register_stage_kind(StageKind("rm", RMStageConfig, "preference", "sft", {"lr": 1e-5},
                              pair_accuracy=PairAccuracy("eval_accuracy", "reward model score"), measures="pairs",
                              produces_reward_model=True, sequence_classifier=True))
