"""What the trainers on preference pairs (dpo, orpo, simpo) hand back alike: the built stage, and the held-out
numbers of its result (TRL logs each method's own chosen-first accuracy as rewards/accuracies)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from types import MethodType
from typing import Any

from transformers import TrainerCallback

from medgpt_ray.stages.inputs import BuiltStage, Sink, StageInputs
from medgpt_ray.stages.outputs import finish_stage


def built_pairs(trainer: Any, tok: Any, lora: bool, train_ds: Any, eval_ds: Any, skipped: dict[str, int],
                template: Any) -> BuiltStage:
    """`skipped`: the train pairs preference_texts left out, by reason."""
    return BuiltStage(trainer, tok, lora=lora, eval_size=len(eval_ds) if eval_ds else 0,
                      extras={"train_pairs": len(train_ds), "skipped_tools_unsupported": skipped["tools_unsupported"],
                              "skipped_too_long": skipped["too_long"]},
                      save_kwargs={"template": template})


def run_pairs(build: Callable[..., BuiltStage], inp: StageInputs, sink: Sink | None,
              callbacks: Sequence[TrainerCallback]) -> dict[str, Any]:
    t0 = time.monotonic()
    built = build(inp, sink, callbacks)
    return finish_stage(inp, built, t0, lambda ev: {
        "eval_loss": ev["eval_loss"], "eval_reward_accuracy": ev.get("eval_rewards/accuracies"),
        "eval_reward_margin": ev.get("eval_rewards/margins"), "eval_pairs": built.eval_size})


def count_pair_tokens(trainer: Any) -> None:
    """TRL's ORPO and CPO batches carry chosen_/rejected_ sequences and no input_ids, so HF's token counter finds
    nothing to count (0 tokens/s): count the real tokens of both sequences of every pair (prompt included, as DPO's
    count does), gathered over the ranks as HF's own count is. The stage's config turns HF's counter off."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        import torch

        real = sum(inputs[k].sum() for k in ("chosen_attention_mask", "rejected_attention_mask") if k in inputs)
        if isinstance(real, torch.Tensor):
            self.state.num_input_tokens_seen += int(self.accelerator.gather(real.reshape(1)).sum().item())
        return type(self).training_step(self, model, inputs, num_items_in_batch)

    trainer.training_step = MethodType(training_step, trainer)
