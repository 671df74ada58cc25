"""The Gated DeltaNet's token mixing, from the projected q/k/v to the delta rule's output, on either path: the
short causal convolution, then the gated delta rule, each conversation from a zero state. The layer
(hybrid/layers.py) and the kernel probe (hybrid/probe_inputs.py) run these same functions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from medgpt_ray.hybrid.segments import SegmentBatch, is_packed


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


@dataclass(frozen=True)
class Conv:
    weight: torch.Tensor  # [D, W]
    bias: torch.Tensor | None
    activation: str


def mix_kernels(ops: tuple[Callable, Callable], qkv: torch.Tensor, conv: Conv, g: torch.Tensor, beta: torch.Tensor,
                cu: torch.Tensor, heads: Heads) -> torch.Tensor:
    """flash-linear-attention: [B, L, C] rows flattened to one sequence of len(cu) - 1 segments -> [B, L, HV, V]."""
    chunk_rule, causal_conv = ops
    rows, width = qkv.shape[:2]
    x = qkv.reshape(1, rows * width, -1)
    weight = conv.weight.to(x.dtype)
    bias = conv.bias.to(x.dtype) if conv.bias is not None else None
    x, _ = causal_conv(x, weight, bias, activation=conv.activation, cu_seqlens=cu)
    q, k, v = heads.split(x)
    out, _ = chunk_rule(q, k, v, g=g.reshape(1, rows * width, -1), beta=beta.reshape(1, rows * width, -1),
                        use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    return out.reshape(rows, width, heads.v_heads, heads.v_dim)


def mix_reference(ops: tuple[Callable, Callable], qkv: torch.Tensor, conv: Conv, g: torch.Tensor,
                  beta: torch.Tensor, cu: torch.Tensor, heads: Heads) -> torch.Tensor:
    """transformers' PyTorch reference on the same inputs. A row of several conversations is cut into its segments,
    padded into a batch of their own (the reference takes no cu_seqlens), and put back."""
    chunk_rule, causal_conv = ops
    rows, width = qkv.shape[:2]
    segments = SegmentBatch.of(cu) if is_packed(cu, rows) else None
    if segments is not None:
        qkv, g, beta = (segments.gather(t.reshape(rows * width, *t.shape[2:])) for t in (qkv, g, beta))
    x = causal_conv(qkv.transpose(1, 2), conv.weight, conv.bias, activation=conv.activation).transpose(1, 2)
    q, k, v = heads.split(x)
    if heads.v_heads != heads.k_heads:  # transformers 5.17's reference expects q and k repeated to the value heads
        q, k = (t.repeat_interleave(heads.v_heads // heads.k_heads, dim=2) for t in (q, k))
    out, _ = chunk_rule(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=True)
    if segments is not None:
        out = segments.scatter(out)
    return out.reshape(rows, width, heads.v_heads, heads.v_dim)
