"""The Gated DeltaNet's token mixing, from the projected q/k/v to the delta rule's output, on either path: the
short causal convolution, then the gated delta rule, each conversation from a zero state. The layer
(hybrid/layers.py) and the kernel probe (hybrid/probe_inputs.py) run these same functions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from medgpt_ray.hybrid.segments import SegmentBatch, is_packed

CHUNK = 64  # the reference's chunk (torch_chunk_gated_delta_rule's default)


@dataclass(frozen=True)
class Heads:
    """A Gated DeltaNet's head layout (its config's linear_* values)."""

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int

    @classmethod
    def of(cls, layer) -> Heads:
        return cls(layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim)

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[..., T, C] (after the convolution) -> q, k [..., T, k_heads, k_dim] and v [..., T, v_heads, v_dim]."""
        kd = self.k_heads * self.k_dim
        q, k, v = torch.split(qkv, [kd, kd, self.v_heads * self.v_dim], dim=-1)
        lead = qkv.shape[:-1]
        return (q.reshape(*lead, self.k_heads, self.k_dim), k.reshape(*lead, self.k_heads, self.k_dim),
                v.reshape(*lead, self.v_heads, self.v_dim))

    def repeated(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k repeated to the value heads, for the PyTorch reference: transformers 5.17's expects them so (its
        layer repeats them before the call), 5.24's repeats them itself when they are not."""
        if self.v_heads == self.k_heads:
            return q, k
        n = self.v_heads // self.k_heads
        return q.repeat_interleave(n, dim=2), k.repeat_interleave(n, dim=2)


@dataclass(frozen=True)
class Conv:
    weight: torch.Tensor  # [D, W]
    bias: torch.Tensor | None
    activation: str

    @classmethod
    def of(cls, layer) -> Conv:
        return cls(layer.conv1d.weight.squeeze(1), layer.conv1d.bias, layer.activation)


def gates(layer, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(beta, g) of a Gated DeltaNet for `hidden_states`: the write strength, and the decay in log space, computed in
    fp32 as transformers does (in fp16/bf16 exp(A_log) could overflow)."""
    beta = layer.in_proj_b(hidden_states).sigmoid()
    g = -layer.A_log.float().exp() * torch.nn.functional.softplus(layer.in_proj_a(hidden_states).float()
                                                                  + layer.dt_bias)
    return beta, g


def mix_kernels(ops: tuple[Callable, Callable], qkv: torch.Tensor, conv: Conv, g: torch.Tensor, beta: torch.Tensor,
                cu: torch.Tensor, heads: Heads, cu_cpu: torch.Tensor | None = None) -> torch.Tensor:
    """flash-linear-attention: [B, L, C] rows flattened to one sequence of len(cu) - 1 segments -> [B, L, HV, V].
    `cu_cpu`, cu on the CPU, spares fla reading the GPU's copy to lay out its chunks (a device sync a call)."""
    chunk_rule, causal_conv = ops
    rows, width = qkv.shape[:2]
    x = qkv.reshape(1, rows * width, -1)
    weight = conv.weight.to(x.dtype)
    bias = conv.bias.to(x.dtype) if conv.bias is not None else None
    x, _ = causal_conv(x, weight, bias, activation=conv.activation, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)
    q, k, v = heads.split(x)
    out, _ = chunk_rule(q, k, v, g=g.reshape(1, rows * width, -1), beta=beta.reshape(1, rows * width, -1),
                        use_qk_l2norm_in_kernel=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)
    return out.reshape(rows, width, heads.v_heads, heads.v_dim)


def mix_reference(ops: tuple[Callable, Callable], qkv: torch.Tensor, conv: Conv, g: torch.Tensor,
                  beta: torch.Tensor, cu: torch.Tensor, heads: Heads) -> torch.Tensor:
    """transformers' PyTorch reference on the same inputs. Rows of several conversations are cut into their
    conversations, run in batches of equal chunk counts (the reference takes no cu_seqlens), and put back."""
    rows, width = qkv.shape[:2]
    if not is_packed(cu, rows):
        return _reference(ops, qkv, conv, g, beta, heads)
    flat_qkv, flat_g, flat_beta = (t.reshape(rows * width, *t.shape[2:]) for t in (qkv, g, beta))
    out = None
    for batch in SegmentBatch.buckets(cu, CHUNK):
        part = _reference(ops, batch.gather(flat_qkv), conv, batch.gather(flat_g), batch.gather(flat_beta), heads)
        out = batch.scatter_into(part.new_zeros(rows * width, *part.shape[2:]) if out is None else out, part)
    return out.reshape(rows, width, heads.v_heads, heads.v_dim)


def _reference(ops: tuple[Callable, Callable], qkv: torch.Tensor, conv: Conv, g: torch.Tensor, beta: torch.Tensor,
               heads: Heads) -> torch.Tensor:
    """[N, L, C] sequences, each from a zero state -> [N, L, HV, V]."""
    chunk_rule, causal_conv = ops
    x = causal_conv(qkv.transpose(1, 2), conv.weight, conv.bias, activation=conv.activation).transpose(1, 2)
    q, k, v = heads.split(x)
    q, k = heads.repeated(q, k)
    out, _ = chunk_rule(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=True)
    return out
