"""A Gated DeltaNet call with a cache (generation: the prefill, then one token a step), with the delta rule's kernel
chosen per call: flash-linear-attention's (chunked for the prefill, fused recurrent for a decode step) on CUDA where
it imports, transformers' PyTorch reference elsewhere. transformers' own layer binds fla whenever it is installed,
also for a model on the CPU, whose tensors Triton cannot read ("Pointer argument cannot be accessed from Triton"):
hence our own call. The short convolution stays transformers' PyTorch one (a 4-tap update a step), as transformers
runs it without causal-conv1d. The cache is read through its layer's attributes, which transformers 5.17 and 5.24
share (5.24 adds get_conv_state and friends, 5.17 has none of them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from medgpt_ray.hybrid import kernels
from medgpt_ray.hybrid.mixing import Conv, Heads, gates
from medgpt_ray.hybrid.ops import fla_kernels, reference


def _states(cache: Any, idx: int) -> tuple[torch.Tensor | None, torch.Tensor | None, bool]:
    """(conv state, recurrent state, recording past) of layer `idx`; None, None before its first update."""
    layer = cache.layers[idx]
    recording = bool(getattr(layer, "record_past", False))
    if not layer.has_previous_state[0]:
        return None, None, recording
    return layer.conv_states[0], layer.recurrent_states[0], recording


def _delta_rule(decode: bool, x: torch.Tensor) -> tuple[Callable, bool]:
    """(the delta rule for this call, whether it is the reference). Inside a compiled step (the static path's decode,
    generation/decode_path.py) the reference's few tensor ops for one token are traced into the step's graph; fla's
    autotuned Triton launch would be a call dynamo has to trace through or break at."""
    if not torch.compiler.is_compiling() and kernels.route(x) == kernels.KERNELS:
        fla = fla_kernels()
        return (fla.recurrent if decode else fla.chunk), False
    ref = reference()
    return ref["torch_recurrent_gated_delta_rule" if decode else "torch_chunk_gated_delta_rule"], True


def cached_mix(layer: Any, hidden_states: torch.Tensor, cache: Any) -> torch.Tensor:
    """The delta rule's output [B, L, HV, V] of `layer` on `hidden_states`, the cache updated."""
    rows, width, _ = hidden_states.shape
    conv_state, recurrent, recording = _states(cache, layer.layer_idx)
    ref, conv = reference(), Conv.of(layer)
    qkv = layer.in_proj_qkv(hidden_states).transpose(1, 2)
    if conv_state is not None and width == 1 and not recording:
        qkv = ref["causal_conv1d_update"](qkv, conv_state, conv.weight, conv.bias, conv.activation)
    else:
        qkv = cache.update_conv_state(qkv, layer.layer_idx, conv_kernel_size=layer.conv_kernel_size)
        qkv = ref["causal_conv1d_fn"](qkv, conv.weight, conv.bias, activation=conv.activation)[:, :, -width:]
    heads = Heads.of(layer)
    q, k, v = heads.split(qkv.transpose(1, 2))
    beta, g = gates(layer, hidden_states)
    rule, is_reference = _delta_rule(recurrent is not None and width == 1, qkv)
    if is_reference:
        q, k = heads.repeated(q, k)
    out, last = rule(q, k, v, g=g, beta=beta, initial_state=recurrent, output_final_state=True,
                     use_qk_l2norm_in_kernel=True)
    cache.update_recurrent_state(last, layer.layer_idx)
    return out
