"""The kernel probe's inputs and its two measures (hybrid/kernels.probe): three conversations packed into one
sequence, run through the same mixing functions the layer runs (hybrid/mixing.py), on fla's kernels in bf16 and on
the reference in fp32."""

from __future__ import annotations

from collections.abc import Callable

import torch

from medgpt_ray.hybrid.mixing import Conv, Heads, mix_kernels, mix_reference
from medgpt_ray.hybrid.ops import reference_ops

# Three conversations in one flattened sequence, crossing fla's 64-token chunks, in heads of the real models' size.
PROBE_LENGTHS = (40, 88, 17)
PROBE_HEADS, PROBE_HEAD_DIM, PROBE_CONV = 4, 64, 4


def _inputs(device: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(0)
    n, h, d = sum(PROBE_LENGTHS), PROBE_HEADS, PROBE_HEAD_DIM
    channels = 3 * h * d
    cpu = {"qkv": torch.randn(1, n, channels, generator=g),
           "weight": torch.randn(channels, PROBE_CONV, generator=g) / PROBE_CONV,
           "g": -torch.rand(1, n, h, generator=g) * 0.5,
           "beta": torch.rand(1, n, h, generator=g)}
    return {k: v.to(device) for k, v in cpu.items()}


def _cu(device: torch.device) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(PROBE_LENGTHS).cumsum(0).tolist()], device=device,
                        dtype=torch.int32)


def _run(ops: tuple[Callable, Callable], mix: Callable, inputs: dict[str, torch.Tensor], dtype: torch.dtype,
         cu: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    leaves = {k: v.detach().to(dtype).requires_grad_() for k, v in inputs.items()}
    heads = Heads(PROBE_HEADS, PROBE_HEADS, PROBE_HEAD_DIM, PROBE_HEAD_DIM)
    extra = {"cu_cpu": cu.to("cpu", torch.int64)} if mix is mix_kernels else {}  # as the layer calls the kernels
    out = mix(ops, leaves["qkv"], Conv(leaves["weight"], None, "silu"), leaves["g"], leaves["beta"], cu, heads,
              **extra)
    return out, leaves


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()


def forward_error(ops: tuple[Callable, Callable], device: torch.device) -> float:
    inputs, cu = _inputs(device), _cu(device)
    with torch.no_grad():
        got, _ = _run(ops, mix_kernels, inputs, torch.bfloat16, cu)
        want, _ = _run(reference_ops(), mix_reference, inputs, torch.float32, cu)
    return _relative(got, want)


def backward_error(ops: tuple[Callable, Callable], device: torch.device) -> float:
    """The largest relative difference of the input gradients (q/k/v, convolution weight, gate, beta)."""
    inputs, cu = _inputs(device), _cu(device)
    weights = torch.randn(1, sum(PROBE_LENGTHS), PROBE_HEADS, PROBE_HEAD_DIM,
                          generator=torch.Generator(device="cpu").manual_seed(1)).to(device)
    grads = []
    for run_ops, mix, dtype in ((ops, mix_kernels, torch.bfloat16),
                                (reference_ops(), mix_reference, torch.float32)):
        out, leaves = _run(run_ops, mix, inputs, dtype, cu)
        (out.float() * weights).sum().backward()
        grads.append({k: v.grad for k, v in leaves.items()})
        torch.cuda.synchronize(device)
    return max(_relative(grads[0][k], grads[1][k]) for k in grads[1])
