"""What the trainers on preference pairs (dpo, orpo, simpo; kto on their unpaired halves) hand back alike: the
built stage, and the held-out numbers of its result (TRL logs each method's own chosen-first accuracy as
rewards/accuracies)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from transformers import TrainerCallback

from medgpt_ray.stages.inputs import BuiltStage, Sink, StageInputs
from medgpt_ray.stages.outputs import finish_stage


def built_pairs(trainer: Any, tok: Any, lora: bool, train_ds: Any, eval_ds: Any, skipped: dict[str, int],
                template: Any) -> BuiltStage:
    """`skipped`: the train pairs preference_texts left out, by reason."""
    return BuiltStage(trainer, tok, lora=lora, eval_size=len(eval_ds) if eval_ds else 0,
                      extras={"train_pairs": len(train_ds), "skipped_tools_unsupported": skipped["tools_unsupported"],
                              "skipped_too_long": skipped["too_long"], "overlong": skipped["overlong"]},
                      save_kwargs={"template": template})


def run_pairs(build: Callable[..., BuiltStage], inp: StageInputs, sink: Sink | None,
              callbacks: Sequence[TrainerCallback],
              held_out: Callable[[BuiltStage], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Build, train, evaluate, save. The held-out accuracy is TRL's rewards/accuracies, or what `held_out` scores
    after training (kto: its pairs' implicit rewards; TRL logs no pair accuracy for unpaired examples)."""
    t0 = time.monotonic()
    built = build(inp, sink, callbacks)
    return finish_stage(inp, built, t0, lambda ev: {
        "eval_loss": ev["eval_loss"], "eval_reward_accuracy": ev.get("eval_rewards/accuracies"),
        "eval_reward_margin": ev.get("eval_rewards/margins"), "eval_pairs": built.eval_size,
        **(held_out(built) if held_out else {})})
