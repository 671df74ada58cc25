"""The reward model of an online-RL stage in a Ray actor of its own (`stages.<stage>.reward_model_gpu: true`).

Beside the policy, a reward network costs every training worker its size in GPU memory (a 7B one 13.2 GiB: two
merged 7B networks never share a 24 GiB card). With reward_model_gpu, one actor holds it on the GPU the placement
gave it (run/gpu_placement.place_reward_model: plan.reward_model_gpu), and the workers' reward function is a
client that sends the texts there (stages/rewards.py takes it as `reward_model`, as it takes RewardModelScore).
The actor is bound to its GPU the way stage workers are (placement/device.py): that GPU's resource token, Ray's
CUDA_VISIBLE_DEVICES left alone, ours naming that one GPU. A CPU run's actor is a process of its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import ray

from medgpt_ray.config import OnlineRLStageConfig, reward_model_kind
from medgpt_ray.placement.device import GPU_TOKEN
from medgpt_ray.stages.inputs import StageInputs


class RewardModelServer:
    """The rm stage's merged model scoring prompt + completion texts (stages/rewards.py RewardModelScore), on this
    actor's device."""

    def __init__(self, model_dir: str, use_gpu: bool):
        import torch

        from medgpt_ray.stages.rewards import RewardModelScore

        device = "cuda" if use_gpu and torch.cuda.is_available() else "cpu"
        self.scorer = RewardModelScore(model_dir, device=device)
        self.calls = 0

    def score(self, prompts: list[Any], completions: list[Any]) -> list[float | None]:
        self.calls += 1
        return self.scorer(prompts, completions)

    def where(self) -> dict[str, Any]:
        """What this actor runs on: its Ray resources, the CUDA devices it sees, how often it scored."""
        ctx = ray.get_runtime_context()
        return {"resources": ctx.get_assigned_resources(), "node_id": ctx.get_node_id(), "calls": self.calls,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "device": self.scorer.device}


class RemoteRewardModel:
    """The workers' `reward_model` reward when the reward model is an actor: TRL's reward-function signature, the
    texts sent to the actor, its scores back. Picklable (an actor handle), so it travels in StageInputs."""

    def __init__(self, actor: Any):
        self.actor = actor
        self.__name__ = "reward_model"  # TRL logs rewards/<__name__>/mean, as for RewardModelScore

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        return ray.get(self.actor.score.remote(list(prompts), list(completions)))


def start_reward_actor(model_dir: str, use_gpu: bool, gpu: int | None, env: dict[str, str]) -> Any:
    """The actor: on physical GPU `gpu` when the placement chose one, on any GPU Ray gives it when it did not (a
    stage run without a placement), else a CPU process taking none of the stage's CPUs; `env` its environment (the
    workers'; the GPU binding added)."""
    options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0, "num_gpus": 1 if use_gpu else 0}
    env = dict(env)
    if use_gpu and gpu is not None:
        token = GPU_TOKEN.format(gpu)
        options["resources"] = {token: 1} if token in ray.cluster_resources() else None
        env.update({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": str(gpu)})
    options["runtime_env"] = {"env_vars": env}
    return ray.remote(RewardModelServer).options(**options).remote(model_dir, use_gpu)


@contextmanager
def reward_model_actor(inputs: StageInputs, env: dict[str, str]) -> Iterator[StageInputs]:
    """`inputs` as they go to the workers: with reward_model_gpu, carrying the client of a reward-model actor
    started here (and killed when the stage ends, however it ends); otherwise unchanged."""
    if not (isinstance(inputs.cfg, OnlineRLStageConfig) and inputs.cfg.reward_model_gpu):
        yield inputs
        return
    rm = reward_model_kind()
    if rm not in inputs.needs:
        raise ValueError(f"stages.{inputs.stage}.reward_model_gpu: no finished {rm} stage was given to serve")
    actor = start_reward_actor(inputs.needs[rm], inputs.plan.use_gpu, inputs.plan.reward_model_gpu, env)
    try:
        yield replace(inputs, reward_scorer=RemoteRewardModel(actor))
    finally:
        ray.kill(actor)
