"""Which kernels a Gated DeltaNet call runs on (issue 47 item 1).

flash-linear-attention (fla, the `gpu` extra) has Triton kernels for the delta rule and the short convolution, both
taking `cu_seqlens`. Its forward runs wherever it imports on CUDA. Its backward does not always: fla 0.6.0 refuses the
gated `chunk_bwd_dqkwg` on Hopper under Triton >= 3.4 and < 3.7.1 ("incorrect results ... upgrade Triton or install
tilelang"), and a refusal raised inside a training step is a traceback mid-stage. So a backward goes to fla only on
a device where `probe` ran fla's forward and backward on small packed inputs in this process and matched the
PyTorch reference; every other call that needs gradients takes transformers' own reference (correct, slower).

`probe` is what the planner is told (the pipeline runs it as a one-GPU task before planning, run/planning.py) and
what a training process runs once on its device when a hybrid model is built (layers.install); its `why` is the
sentence plan.json and the plan line carry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from medgpt_ray.hybrid import probe_inputs
from medgpt_ray.hybrid.ops import FLA, fla_kernels, kernel_ops

KERNELS, REFERENCE = "fla", "reference"
TOLERANCE = 3e-2  # bf16 kernels against the fp32 reference: max |difference| over max |reference|


@dataclass(frozen=True)
class KernelProbe:
    """What one device can run: fla's forward, its backward, and why not where it cannot."""

    device: str
    forward: bool
    backward: bool
    why: str

    @property
    def training(self) -> str:
        """The path a training step's linear-attention layers take."""
        return KERNELS if self.backward else REFERENCE

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"training": self.training}


_PROBED: dict[int, KernelProbe] = {}


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def probed(device: torch.device) -> KernelProbe | None:
    """This process's probe of `device`, if it ran."""
    return _PROBED.get(_index(device))


def route(x: torch.Tensor) -> str:
    """KERNELS or REFERENCE for a call on `x` (the projected q/k/v): fla where it is importable on x's CUDA device,
    and for a call that builds a graph, only where the device's probe passed fla's backward."""
    if x.device.type != "cuda" or isinstance(fla_kernels(), str):
        return REFERENCE
    found = probed(x.device)
    if torch.is_grad_enabled() and x.requires_grad:
        return KERNELS if found is not None and found.backward else REFERENCE
    return REFERENCE if found is not None and not found.forward else KERNELS


def demote(device: torch.device, error: Exception) -> KernelProbe:
    """fla's kernels failed in a call on `device` after its probe passed (a shape the probe did not meet): from now on
    this process runs the reference there, and says so once, with the error's first line."""
    index = _index(device)
    name = _PROBED[index].device if index in _PROBED else str(device)
    found = KernelProbe(name, False, False, f"{FLA} failed in a call on {name} ({_first_line(error)}); the PyTorch "
                                            f"reference from then on")
    _PROBED[index] = found
    print(f"[linear attention] {found.why}", flush=True)
    return found


def _device_name(index: int | None) -> str:
    return torch.cuda.get_device_name(index) if torch.cuda.is_available() else "cpu"


def probe(index: int | None = None) -> KernelProbe:
    """Run fla's delta rule and convolution forward and backward on small packed bf16 inputs on CUDA device `index`
    and compare them with the reference; cached per device for this process. Never raises."""
    if not torch.cuda.is_available():
        return KernelProbe("cpu", False, False, "no CUDA device here: linear attention runs on the PyTorch reference")
    index = torch.cuda.current_device() if index is None else index
    if index in _PROBED:
        return _PROBED[index]
    name = _device_name(index)
    missing = fla_kernels()
    found = KernelProbe(name, False, False, missing) if isinstance(missing, str) else \
        _probe_kernels(name, index, kernel_ops())
    _PROBED[index] = found
    return found


def _probe_kernels(name: str, index: int, ops: tuple[Callable, Callable]) -> KernelProbe:
    with torch.autocast("cuda", enabled=False), torch.enable_grad():
        try:
            err = probe_inputs.forward_error(ops, torch.device("cuda", index))
        except Exception as e:  # a kernel that fails to compile or launch: the reason is the plan's sentence
            return KernelProbe(name, False, False, f"{FLA}'s forward failed on {name}: {_first_line(e)}")
        if err > TOLERANCE:
            return KernelProbe(name, False, False, f"{FLA}'s forward differs from the reference by {err:.3g} "
                                                   f"on {name}")
        try:
            err = probe_inputs.backward_error(ops, torch.device("cuda", index))
        except Exception as e:
            return KernelProbe(name, True, False, f"{FLA}'s backward refused on {name}: {_first_line(e)}; "
                                                  f"training takes the PyTorch reference, generation the kernels")
    if err > TOLERANCE:
        return KernelProbe(name, True, False, f"{FLA}'s backward differs from the reference by {err:.3g} on {name}; "
                                              f"training takes the PyTorch reference")
    return KernelProbe(name, True, True, f"{FLA}'s kernels, forward and backward, matched the reference on {name}")


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:240] if text else ''}"

