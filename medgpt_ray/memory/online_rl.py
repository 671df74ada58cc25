"""An online-RL stage's TrainSetup fields and hints (grpo's and rloo's memory models, kinds/<kind>/memory.py): the
generation phase, the reward model and the reference its keys ask for (memory/generation.py prices them)."""

from __future__ import annotations

from typing import Any

from medgpt_ray.config.online_rl import OnlineRLStageConfig


def online_rl_fields(cfg: OnlineRLStageConfig, reference: bool, use_gpu: bool) -> dict[str, Any]:
    """An online-RL stage's generation phase, its reward model and its reference (a KL term: `reference`). A reward
    model in an actor of its own (reward_model_gpu) is not on the policy's device; with a shared base
    (reward_shared_base, resolved by the pipeline config) it is an adapter on the policy's base, no network."""
    shared = cfg.reward_shared_base is True
    return {"generations": cfg.num_generations, "completion_len": cfg.max_completion_length,
            "reward_network": "reward_model" in cfg.reward_funcs and not cfg.reward_model_gpu and not shared,
            "reward_adapter": shared, "reward_lora_rank": cfg.reward_lora_rank if shared else 0,
            "reward_model_gpu": cfg.reward_model_gpu, "reference": reference,
            "generation_path": cfg.generation_path, "generation_on_gpu": use_gpu}


def online_rl_hints(cfg: OnlineRLStageConfig, s: Any) -> list[tuple[str, dict[str, Any]]]:
    """Shorter completions: the training sequence (prompt + completion) shrinks with them."""
    return [(f"max_completion_length {c}", {"completion_len": c, "seq_len": s.seq_len - s.completion_len + c})
            for c in (s.completion_len // 2, s.completion_len // 4) if c >= 16]
