"""GRPO: TRL's GRPOTrainer on prompt records (data.prompt: prompt turns + a reference answer), from the SFT model.

Each step samples `num_generations` completions per prompt with the trainer's own generate (no vLLM), scores them
with the reward functions the config names (stages/rewards.py), and trains on the group-relative advantages. With
LoRA the reference of the KL term (beta > 0) is the adapter-off policy; full training loads a frozen copy. The
reward_model reward is the rm's merged model beside the policy, an actor's (reward_model_gpu), or with
reward_shared_base the rm's LoRA adapter on the policy's own base (stages/reward_adapter.py).

Built and run by stages/online_rl.py (build_online, run_online: its data, held-out greedy rewards and rollouts),
which serves rloo too (kinds/rloo/stage.py): TRL's RLOOTrainer takes GRPOTrainer's arguments."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import TrainerCallback

from medgpt_ray.stages.inputs import BuiltStage, Sink, StageInputs
from medgpt_ray.stages.online_rl import build_online, online_kwargs, run_online


def grpo_args(inp: StageInputs) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(**online_kwargs(inp), loss_type=inp.cfg.loss_type, scale_rewards=inp.cfg.scale_rewards)


def build(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> BuiltStage:
    from trl import GRPOTrainer

    # TRL's GRPOTrainer has no reward clipping: reward_clip_range clips each reward function's values here.
    return build_online(inp, GRPOTrainer, grpo_args, sink, callbacks, clip=inp.cfg.reward_clip_range)


def run(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    return run_online(inp, build, sink, callbacks)


