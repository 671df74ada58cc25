"""RLOO (MedicalGPT's "PPO" stage): TRL's RLOOTrainer on prompt records (data.prompt), from the SFT model, rewarded by
the rm stage's model (`needs` rm).

Each step samples `num_generations` (k) completions per prompt with the trainer's own generate (no vLLM), scores
them with the reward model (stages/rewards.py's RewardModelScore: the rm stage's merged model, no grad, on the
policy's device) and any rule rewards the config adds, subtracts beta x the completion's log-ratio to the reference
from its reward, and trains on the leave-one-out advantage: a completion's reward less the mean of the other k - 1 of
its group. With LoRA the reference is the adapter-off policy (no second copy); full training with beta > 0 loads a
frozen copy. When rm trained with LoRA from this stage's `from` (reward_shared_base, resolved by the config), the
reward model is no network either: the rm's adapter + score head on the policy's own base (stages/reward_adapter.py),
one base holding the policy's adapter, the reward adapter and (all adapters off) the reference.

Built and run as grpo is (stages/online_rl.py build_online/run_online): the same prompt shards in TRL's group order,
generation counters and held-out greedy scores, where `eval_reward_model` (the reward model's mean score of the
held-out greedy completions, before and after) is the number RLOO raises, beside the accuracy reward against the
reference answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import TrainerCallback

from medgpt_ray.stages.inputs import BuiltStage, Sink, StageInputs
from medgpt_ray.stages.online_rl import build_online, online_kwargs, run_online


def rloo_args(inp: StageInputs) -> Any:
    from trl import RLOOConfig

    clip = inp.cfg.reward_clip_range
    return RLOOConfig(**online_kwargs(inp), normalize_advantages=inp.cfg.normalize_advantages,
                      reward_clip_range=tuple(clip) if clip else None)


def build(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> BuiltStage:
    from trl import RLOOTrainer

    if "rm" not in inp.needs:
        raise ValueError("stages.rloo.needs: rloo is rewarded by the rm stage's model, and no finished rm stage "
                         "was given")
    return build_online(inp, RLOOTrainer, rloo_args, sink, callbacks)


def run(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    return run_online(inp, build, sink, callbacks)
