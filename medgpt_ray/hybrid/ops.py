"""The two implementations of a Gated DeltaNet's delta rule and short convolution: flash-linear-attention's kernels
(the `gpu` extra) and transformers' own PyTorch reference."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

FLA = "flash-linear-attention"
INSTALL = "pip install 'medgpt-ray[gpu]'"


@functools.cache
def fla_ops() -> tuple[Callable, Callable] | str:
    """(chunk_gated_delta_rule, causal_conv1d) from flash-linear-attention, or why they cannot be imported."""
    try:
        from fla.modules.causal_conv1d import causal_conv1d
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # not installed, or installed without a working Triton: either way not usable here
        return f"{FLA} is not importable here ({type(e).__name__}: {str(e).splitlines()[0][:160]}); {INSTALL}"
    return chunk_gated_delta_rule, causal_conv1d


def reference_ops() -> tuple[Callable, Callable]:
    """transformers' own PyTorch delta rule and causal convolution, never the kernels its decorators bind."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling

    return inspect.unwrap(modeling.torch_chunk_gated_delta_rule), inspect.unwrap(modeling.causal_conv1d_fn)
