"""A Gated DeltaNet call with a cache (generation: the prefill, then one token a step), with the delta rule's kernel
chosen per call: flash-linear-attention's (chunked for the prefill, fused recurrent for a decode step) on CUDA where
it imports, transformers' PyTorch reference elsewhere. transformers' own layer binds fla whenever it is installed,
also for a model on the CPU, whose tensors Triton cannot read ("Pointer argument cannot be accessed from Triton"):
hence our own call. The short convolution stays transformers' PyTorch one (a 4-tap update a step), as transformers
runs it without causal-conv1d. The cache is read through its layer's attributes, which transformers 5.17 and 5.24
share (5.24 adds get_conv_state and friends, 5.17 has none of them)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from medgpt_ray.hybrid import kernels
from medgpt_ray.hybrid.mixing import Heads

_REFERENCE: dict[str, Callable] = {}  # filled once; a plain dict, which a compiled decode step reads as a constant


def _reference() -> dict[str, Callable]:
    if not _REFERENCE:
        from transformers.models.qwen3_5 import modeling_qwen3_5 as m

        _REFERENCE.update({name: inspect.unwrap(getattr(m, name)) for name in (
            "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
            "causal_conv1d_update")})
    return _REFERENCE


@functools.cache
def _fla_recurrent() -> Callable | None:
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception:  # as hybrid/ops.fla_ops: not usable here, the reference decodes
        return None
    return fused_recurrent_gated_delta_rule


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
        fla = _fla_recurrent() if decode else kernels.fla_ops()[0]
        if fla is not None:
            return fla, False
    ref = _reference()
    return ref["torch_recurrent_gated_delta_rule" if decode else "torch_chunk_gated_delta_rule"], True


def cached_mix(layer: Any, hidden_states: torch.Tensor, cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(the delta rule's output [B, L, HV, V], z [B*L*HV, V]) of `layer` on `hidden_states`, the cache updated."""
    rows, width, _ = hidden_states.shape
    conv_state, recurrent, recording = _states(cache, layer.layer_idx)
    ref = _reference()
    qkv = layer.in_proj_qkv(hidden_states).transpose(1, 2)
    weight, bias = layer.conv1d.weight.squeeze(1), layer.conv1d.bias
    if conv_state is not None and width == 1 and not recording:
        qkv = ref["causal_conv1d_update"](qkv, conv_state, weight, bias, layer.activation)
    else:
        qkv = cache.update_conv_state(qkv, layer.layer_idx, conv_kernel_size=layer.conv_kernel_size)
        qkv = ref["causal_conv1d_fn"](qkv, weight, bias, activation=layer.activation)[:, :, -width:]
    heads = Heads.of(layer)
    q, k, v = heads.split(qkv.transpose(1, 2))
    beta = layer.in_proj_b(hidden_states).sigmoid()
    g = -layer.A_log.float().exp() * torch.nn.functional.softplus(layer.in_proj_a(hidden_states).float()
                                                                  + layer.dt_bias)
    rule, is_reference = _delta_rule(recurrent is not None and width == 1, qkv)
    if is_reference:
        q, k = heads.repeated(q, k)
    out, last = rule(q, k, v, g=g, beta=beta, initial_state=recurrent, output_final_state=True,
                     use_qk_l2norm_in_kernel=True)
    cache.update_recurrent_state(last, layer.layer_idx)
    return out, layer.in_proj_z(hidden_states).reshape(-1, layer.head_v_dim)
