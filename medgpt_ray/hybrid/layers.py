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
from medgpt_ray.hybrid.segments import LastSegments, row_starts

LAST_SEGMENTS = LastSegments()  # this process's: a pass's layers share their position ids' segments
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
        z = self.in_proj_z(hidden_states).reshape(-1, self.head_v_dim)
        if cache is not None:
            out = self.norm(cached_mix(self, hidden_states, cache).reshape(-1, self.head_v_dim), z)
        else:
            beta, g = gates(self, hidden_states)
            out = self._mix_and_norm(self.in_proj_qkv(hidden_states), g, beta, z, positions,
                                     kwargs.get("cu_seq_lens_q"))
        return self.out_proj(out.reshape(*hidden_states.shape[:2], -1))

    @torch.compiler.disable
    def _mix_and_norm(self, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, z: torch.Tensor,
                      positions: torch.Tensor | None, flat_cu: torch.Tensor | None) -> torch.Tensor:
        """The delta rule's output, gate-normed, [B * L * HV, V], without a cache, each conversation from a zero
        state. Eager inside compiled layers (stages/speed.py): fla's Triton kernels and its gated norm are launched
        by Python wrappers dynamo should not trace, the segments have a data-dependent count, and the reference's
        chunk loop unrolled would not finish compiling (issue 34); the projections and the MLP around it compile."""
        rows, width = qkv.shape[:2]
        cu, cu_cpu = self._segments(rows, width, positions, flat_cu, qkv.device)
        conv, heads = Conv.of(self), Heads.of(self)
        out = None
        if kernels.route(qkv) == kernels.KERNELS:
            try:
                out = mix_kernels(kernel_ops(), qkv, conv, g, beta, cu, heads, cu_cpu)
            except Exception as e:  # said once, and the device runs the reference from then on (kernels.demote)
                kernels.demote(qkv.device, e)
        if out is None:
            out = mix_reference(reference_ops(), qkv, conv, g, beta, cu, heads)
        return self.norm(out.reshape(-1, self.head_v_dim), z)

    def _segments(self, rows: int, width: int, positions: torch.Tensor | None, flat_cu: torch.Tensor | None,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(cu_seqlens on `device`, its CPU copy where one is at hand)."""
        if positions is not None and positions.shape == (rows, width):
            return LAST_SEGMENTS.of(positions, device)
        if flat_cu is not None and rows == 1:
            return flat_cu.to(device=device, dtype=torch.int32), None
        return row_starts(rows, width, device), None


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
