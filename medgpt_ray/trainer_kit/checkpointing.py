"""Which decoder layers recompute their activations, through the flag transformers gives each layer.

transformers' GradientCheckpointingLayer checkpoints a forward when its instance flag `gradient_checkpointing` is
set (the library's per-layer switch: `_set_gradient_checkpointing` writes it, `every_n_layers` included). The plan
checkpoints the first `ckpt_fraction` of the layers (docs/ARCHITECTURE.md, memory plan), so the flag of the layers
past that fraction is switched off before every micro-batch: the Trainer switches checkpointing on for every layer
when training starts, and TRL's DPO switches it off and on again (all layers) around its reference pass, after the
policy's forward of each micro-batch. The online-RL kinds' rollouts (TRL's `unwrap_model_for_generation`) switch it
back on for every layer after generating, which happens inside a micro-batch, after the callbacks ran: the trainer
behaviour FractionAtEveryForward switches the tail off again before each loss forward.
tests/stages/test_checkpoint_fraction.py holds the fraction across steps."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback


def decoder_layers(model) -> list:
    """The model's decoder layers: transformers' GradientCheckpointingLayer instances, in order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def checkpointing_kwargs(enabled: bool = True) -> dict[str, Any]:
    """transformers 5.24 renamed gradient_checkpointing to activation_checkpointing; the GPU image's
    5.17 may only know the old name. Use whichever this TrainingArguments has."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    prefix = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    return {prefix: enabled, f"{prefix}_kwargs": {"use_reentrant": False} if enabled else None}


class SelectiveCheckpointing(TrainerCallback):
    """Checkpoint only the first `fraction` of the decoder layers: the others' flag is switched off at the start of
    every optimizer step and after every micro-batch that does not end one (on_substep_end), i.e. before each
    micro-batch's forward, whatever the trainer switched on since."""

    def __init__(self, fraction: float):
        self.fraction = fraction
        self._layers: list = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        layers = decoder_layers(model)
        self._layers = layers[round(self.fraction * len(layers)):]
        self.switch_off()

    def on_step_begin(self, args, state, control, **kwargs):
        self.switch_off()

    def on_substep_end(self, args, state, control, **kwargs):
        self.switch_off()

    def switch_off(self) -> None:
        for layer in self._layers:
            layer.gradient_checkpointing = False


class FractionAtEveryForward:
    """A trainer behaviour (trainer_kit/compose.py) for trainers that generate inside a micro-batch (grpo, rloo, opd):
    the planned fraction is restored right before the loss's forward, after the rollout re-enabled every layer."""

    def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, SelectiveCheckpointing):
                callback.switch_off()
        return super().compute_loss(*args, **kwargs)
