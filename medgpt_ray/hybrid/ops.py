"""The two implementations of a Gated DeltaNet's delta rule and short convolution, resolved once for every caller
(the layer's training path, its cached path, the probe): flash-linear-attention's kernels (the `gpu` extra) and
transformers' own PyTorch reference."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import NamedTuple

FLA = "flash-linear-attention"
INSTALL = "pip install 'medgpt-ray[gpu]'"


class FlaKernels(NamedTuple):
    chunk: Callable  # chunk_gated_delta_rule: a sequence (or cu_seqlens' sequences) at once
    conv: Callable  # causal_conv1d, [B, T, D] with cu_seqlens
    recurrent: Callable  # fused_recurrent_gated_delta_rule: a decode step


@functools.cache
def fla_kernels() -> FlaKernels | str:
    """flash-linear-attention's kernels, or why they cannot be imported."""
    try:
        from fla.modules.causal_conv1d import causal_conv1d
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except Exception as e:  # not installed, or installed without a working Triton: either way not usable here
        return f"{FLA} is not importable here ({type(e).__name__}: {str(e).splitlines()[0][:160]}); {INSTALL}"
    return FlaKernels(chunk_gated_delta_rule, causal_conv1d, fused_recurrent_gated_delta_rule)


_REFERENCE: dict[str, Callable] = {}  # filled once; a plain dict, which a compiled decode step reads as a constant
REFERENCE_NAMES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                   "causal_conv1d_update")


def reference() -> dict[str, Callable]:
    """transformers' own PyTorch functions by name, never the kernels its decorators bind to them."""
    if not _REFERENCE:
        from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling

        _REFERENCE.update({name: inspect.unwrap(getattr(modeling, name)) for name in REFERENCE_NAMES})
    return _REFERENCE


def reference_ops() -> tuple[Callable, Callable]:
    """(delta rule, causal convolution) of the reference, as mix_reference takes them."""
    ref = reference()
    return ref["torch_chunk_gated_delta_rule"], ref["causal_conv1d_fn"]


def kernel_ops() -> tuple[Callable, Callable]:
    """(delta rule, causal convolution) of fla, as mix_kernels takes them (where fla_kernels found them)."""
    found = fla_kernels()
    assert not isinstance(found, str), found
    return found.chunk, found.conv
