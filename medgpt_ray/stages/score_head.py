"""A reward model's score head, found under whatever wraps it and computed in fp32 (the seed's field report on
8 x 4090: in bf16 the reward model's loss collapsed to 0).

Why: bf16 keeps 8 significant bits. Scores of a few hundred are 2 apart in bf16 (256.0 and 256.5 both round to
256.0), so a pair's margin rounds to 0 and the Bradley-Terry loss reads log 2 whatever the model learned; the online-RL
rewards of a bf16 reward model carry the same rounding into the advantages. The decoder may stay in bf16 (its hidden
states are what they are); the head's matmul, its output and the pairwise loss on it are taken in fp32: Fp32Linear
upcasts its input and weights and runs outside autocast (autocast would run an fp32 Linear in bf16 again), so its
scores are fp32 and TRL's loss on them (and ours, stages/reward_trainer.py) is computed in fp32. The head's weights
are held in fp32 too (hidden x 1 numbers: nothing to save by bf16), and its forward upcasts them again in case an
engine (DeepSpeed's bf16 mode) casts the module back."""

from __future__ import annotations

from typing import Any

import torch


class Fp32Linear(torch.nn.Linear):
    """nn.Linear computed in fp32 outside autocast: fp32 output whatever the input's, the weights' or autocast's
    dtype. Its state dict is nn.Linear's (the saved model is unchanged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.float()
        with torch.autocast(x.device.type, enabled=False):
            return torch.nn.functional.linear(x.float(), self.weight.float(), bias)


def score_head(model: Any) -> Any:
    """The sequence-classification head under whatever wraps the model (DDP, DeepSpeed, PEFT: its trainable copy's
    wrapper, `modules_to_save`)."""
    inner = model
    while hasattr(inner, "module"):  # DDP, DeepSpeedEngine
        inner = inner.module
    if hasattr(inner, "get_base_model"):  # PEFT
        inner = inner.get_base_model()
    inner = getattr(inner, "_orig_mod", inner)  # torch.compile of the whole model
    head = getattr(inner, "score", None)
    if head is None:
        raise TypeError(f"{type(inner).__name__} has no `score` head: a reward model needs a sequence-classification "
                        f"model with one")
    return head


def as_fp32_linear(linear: torch.nn.Linear) -> Fp32Linear:
    """A new Fp32Linear holding `linear`'s weights (and bias) in fp32, on its device, trainable as it was."""
    new = Fp32Linear(linear.in_features, linear.out_features, bias=linear.bias is not None,
                     device=linear.weight.device, dtype=torch.float32)
    with torch.no_grad():
        new.weight.copy_(linear.weight)
        if linear.bias is not None:
            new.bias.copy_(linear.bias)
    new.requires_grad_(linear.weight.requires_grad)
    return new


def fp32_linears(module: torch.nn.Module) -> torch.nn.Module:
    """`module` with every plain nn.Linear in it (itself, or PEFT's ModulesToSaveWrapper's original and trainable
    copies) replaced by an Fp32Linear with fp32 weights: the module back, a new one where it was a Linear itself. A
    head with no nn.Linear is an error: its scores would stay in bf16 unseen."""
    if type(module) is torch.nn.Linear:
        return as_fp32_linear(module)
    inner = [(parent, name, child) for parent in module.modules() for name, child in parent.named_children()
             if type(child) is torch.nn.Linear]
    if not inner and not any(isinstance(m, Fp32Linear) for m in module.modules()):
        raise TypeError(f"the reward model's score head is a {type(module).__name__} with no nn.Linear in it: it "
                        f"cannot be computed in fp32")
    for parent, name, child in inner:
        setattr(parent, name, as_fp32_linear(child))
    return module


def fp32_score_head(model: Any) -> Any:
    """The model's score head (score_head) computed in fp32 (fp32_linears); the model back."""
    head = score_head(model)
    fp32 = fp32_linears(head)
    if fp32 is not head:
        owner = next(m for m in model.modules() if getattr(m, "score", None) is head)
        owner.score = fp32
    return model
