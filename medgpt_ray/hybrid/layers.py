"""The Gated DeltaNet as we run it: transformers' Qwen3.5 layer with its token mixing chosen per call and packed
rows kept apart (issue 47 items 1-2).

`install(model)` swaps the class of every linear-attention module of a loaded Qwen3.5 (dense or MoE) model for a
subclass, and of their decoder layers for one that hands the layer the position ids (transformers passes them only
to full attention). Nothing inside transformers is reassigned; the weights and state dicts are untouched.

Per call:
- with a cache (generation, prefill and decode): hybrid/cached.py, transformers' own steps with the delta rule on
  fla's kernels on CUDA (forward-only: the Hopper backward check is not met), else on the PyTorch reference;
- without one (training, scoring, reference log-probs): each row's conversations are found from its position ids
  (hybrid/segments.py; TRL's padding-free batches bring `cu_seq_lens_q` too) and every conversation starts from a
  zero state, on fla's kernels with `cu_seqlens` where hybrid/kernels.route allows, else on transformers' PyTorch
  reference with the conversations cut into a batch of their own. Padded rows (one conversation each) take the
  same path."""

from __future__ import annotations

import functools
from typing import Any

import torch

from medgpt_ray.hybrid import kernels
from medgpt_ray.hybrid.cached import cached_mix
from medgpt_ray.hybrid.mixing import Conv, Heads, gates, mix_kernels, mix_reference
from medgpt_ray.hybrid.ops import kernel_ops, reference_ops
from medgpt_ray.hybrid.segments import cu_seqlens, row_starts

POSITIONS = "medgpt_linear_positions"  # the keyword the decoder layer hands the position ids on under
# (module, class) of the linear-attention layers and their decoder layers this subclasses
FAMILIES = (("transformers.models.qwen3_5.modeling_qwen3_5", "Qwen3_5"),
            ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5Moe"))


class PackedDeltaNet:
    """Mixed in before a family's GatedDeltaNet class (hybrid_class)."""

    def forward(self, hidden_states: torch.Tensor, cache: Any = None, attention_mask: torch.Tensor | None = None,
                **kwargs: Any) -> torch.Tensor:
        from transformers.models.qwen3_5.modeling_qwen3_5 import apply_mask_to_padding_states

        positions = kwargs.pop(POSITIONS, None)
        cache = cache if cache is not None else kwargs.pop("cache_params", None)  # 5.24 says cache, 5.17 cache_params
        hidden_states = apply_mask_to_padding_states(hidden_states, attention_mask)
        if cache is not None:
            out = cached_mix(self, hidden_states, cache)
        else:
            out = self._mix(hidden_states, positions, kwargs.get("cu_seq_lens_q"))
        z = self.in_proj_z(hidden_states).reshape(-1, self.head_v_dim)
        return self.out_proj(self.norm(out.reshape(-1, self.head_v_dim), z).reshape(*hidden_states.shape[:2], -1))

    def _segments(self, rows: int, width: int, positions: torch.Tensor | None, flat_cu: torch.Tensor | None,
                  device: torch.device) -> torch.Tensor:
        if positions is not None and positions.shape == (rows, width):
            return cu_seqlens(positions.to(device))
        if flat_cu is not None and rows == 1:
            return flat_cu.to(device=device, dtype=torch.int32)
        return row_starts(rows, width, device)

    def _mix(self, hidden_states: torch.Tensor, positions: torch.Tensor | None,
             flat_cu: torch.Tensor | None) -> torch.Tensor:
        """The delta rule's output [B, L, HV, V] without a cache, each conversation from a zero state."""
        rows, width, _ = hidden_states.shape
        cu = self._segments(rows, width, positions, flat_cu, hidden_states.device)
        qkv = self.in_proj_qkv(hidden_states)
        beta, g = gates(self, hidden_states)
        conv, heads = Conv.of(self), Heads.of(self)
        if kernels.route(qkv) == kernels.KERNELS:
            try:
                return mix_kernels(kernel_ops(), qkv, conv, g, beta, cu, heads)
            except Exception as e:  # said once, and the device runs the reference from then on (kernels.demote)
                kernels.demote(qkv.device, e)
        return mix_reference(reference_ops(), qkv, conv, g, beta, cu, heads)


class PositionsToLinearAttention:
    """Mixed in before a family's decoder layer class: a linear-attention layer gets the position ids too."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "block_type", None) == "linear_attention" and kwargs.get("position_ids") is not None:
            kwargs[POSITIONS] = kwargs["position_ids"]
        return super().forward(*args, **kwargs)


@functools.cache
def hybrid_class(mixin: type, parent: type) -> type:
    """One subclass per (behaviour, transformers class), named after the parent so reprs stay readable."""
    return type(parent.__name__, (mixin, parent), {"__module__": __name__, "__qualname__": parent.__qualname__})


def _family_classes() -> dict[type, type]:
    """{transformers class: the mixin it gets}, for the families importable in this transformers."""
    import importlib

    out: dict[type, type] = {}
    for module, prefix in FAMILIES:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        out[getattr(mod, f"{prefix}GatedDeltaNet")] = PackedDeltaNet
        out[getattr(mod, f"{prefix}DecoderLayer")] = PositionsToLinearAttention
    return out


def install(model: torch.nn.Module) -> int:
    """Swap the linear-attention layers of `model` (and their decoder layers) for the subclasses; returns how many
    linear-attention layers there are (0: not a hybrid, nothing changed). On CUDA, this process's kernel probe runs
    once here, before any training step needs its answer."""
    classes = _family_classes()
    swapped = 0
    for module in model.modules():
        mixin = classes.get(type(module))
        if mixin is None:
            continue
        module.__class__ = hybrid_class(mixin, type(module))
        swapped += mixin is PackedDeltaNet
    if swapped and torch.cuda.is_available():
        kernels.probe()
    return swapped


def is_installed(module: torch.nn.Module) -> bool:
    return isinstance(module, PackedDeltaNet)
