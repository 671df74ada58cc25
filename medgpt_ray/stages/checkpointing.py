"""Which decoder layers recompute their activations, through the flag transformers gives each layer."""

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
    """Checkpoint only the first `fraction` of the decoder layers.

    The Trainer switches checkpointing on for every layer when training starts
    (before on_train_begin). The layers past the fraction are then pinned to
    "never checkpoint": TRL's DPO switches checkpointing off and on again around
    its reference pass every step, which would otherwise re-enable them all.
    Works on the `gradient_checkpointing` flag of transformers'
    GradientCheckpointingLayer, which 5.17 and 5.24 share.
    """

    def __init__(self, fraction: float):
        self.fraction = fraction

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        layers = decoder_layers(model)
        for layer in layers[round(self.fraction * len(layers)):]:
            _pin_no_checkpointing(layer)


def _pin_no_checkpointing(layer) -> None:
    cls = type(layer)
    if getattr(cls, "_medgpt_pinned", False):
        return
    # A data descriptor on the class wins over the flag that enable/disable write into the instance.
    layer.__class__ = type(f"Uncheckpointed{cls.__name__}", (cls,), {
        "_medgpt_pinned": True,
        "gradient_checkpointing": property(lambda self: False, lambda self, value: None),
    })
