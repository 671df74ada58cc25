"""What the trainers on preference pairs (dpo, orpo, simpo) hand back alike: the built stage, and the held-out
numbers of its result (TRL logs each method's own chosen-first accuracy as rewards/accuracies)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from transformers import TrainerCallback

from medgpt_ray.stages.inputs import BuiltStage, Sink, StageInputs
from medgpt_ray.stages.outputs import finish_stage


def built_pairs(trainer: Any, tok: Any, lora: bool, train_ds: Any, eval_ds: Any, skipped_tools: int,
                template: Any) -> BuiltStage:
    return BuiltStage(trainer, tok, lora=lora, eval_size=len(eval_ds) if eval_ds else 0,
                      extras={"train_pairs": len(train_ds), "skipped_tools_unsupported": skipped_tools},
                      save_kwargs={"template": template})


def run_pairs(build: Callable[..., BuiltStage], inp: StageInputs, sink: Sink | None,
              callbacks: Sequence[TrainerCallback]) -> dict[str, Any]:
    t0 = time.monotonic()
    built = build(inp, sink, callbacks)
    return finish_stage(inp, built, t0, lambda ev: {
        "eval_loss": ev["eval_loss"], "eval_reward_accuracy": ev.get("eval_rewards/accuracies"),
        "eval_reward_margin": ev.get("eval_rewards/margins"), "eval_pairs": built.eval_size})
