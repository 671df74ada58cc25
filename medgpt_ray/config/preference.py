"""What the preference kinds share (their own config classes are in kinds/<kind>/config.py, docs/ARCHITECTURE.md,
"The stage-kind contract"): how dpo, orpo and simpo are judged on held-out pairs, and the keys and defaults of the
reference-free kinds (orpo, simpo)."""

from __future__ import annotations

from medgpt_ray.config.base import Auto
from medgpt_ray.config.registry import PairAccuracy
from medgpt_ray.config.stage import LengthGroupedStageConfig

# TRL logs the chosen-first accuracy of DPO, ORPO and CPO (SimPO) as rewards/accuracies, the RewardTrainer as accuracy.
IMPLICIT_REWARD = PairAccuracy("eval_reward_accuracy", "implicit reward beta*log(pi/pi_ref)")
NORMALISED_LOGP = PairAccuracy("eval_reward_accuracy", "length-normalised log-probability")
# Reference-free preference methods, off unless enabled: on TRL's ORPO and CPO trainers (trl.experimental).
REFERENCE_FREE_DEFAULTS = {"enabled": False, "lr": 5e-6}


class ReferenceFreeStageConfig(LengthGroupedStageConfig):
    """The keys of the reference-free preference kinds (orpo, simpo)."""

    compile: Auto | bool = "auto"
    """Compile each decoder layer in place, as for the other kinds (auto: GPU runs except QLoRA, ZeRO-3 and stages
    capped below 50 steps). TRL's ORPO and CPO collators pad each micro-batch to its own longest pair; the fused
    concatenated pass pads it on to a multiple of 128 tokens when compiled (trainer_kit/fused_preference.py), so the
    compiled layers see a few lengths."""
