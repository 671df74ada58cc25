"""Ray Train's torch backend for a stage placed on chosen GPUs: the workers keep the CUDA_VISIBLE_DEVICES the
placement gives them and drive the chosen GPU of their local rank from the first line of the worker.

Why Ray's defaults do not do: the placement holds GPUs through per-GPU resource tokens, while Ray hands out its
own GPU ids from the node's free list (placement/device.py). By default Ray Train then (1) rewrites every
worker's CUDA_VISIBLE_DEVICES to the union of those Ray ids on the node ("share CUDA_VISIBLE_DEVICES"), and (2)
calls torch.cuda.set_device on the device of the worker's Ray id before the train function starts. With
concurrent stages, (1) pointed a worker placed on GPU 5 at GPU 2 (caught by tests/ray/test_placement_ray.py), and
(2) opens a CUDA context (hundreds of MiB) on a GPU the stage did not choose, maybe one another job holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from ray.train.torch import TorchConfig
from ray.train.torch.config import _TorchBackend

from medgpt_ray.placement.device import bind_worker_device


class _KeepPlacedDevices(_TorchBackend):
    # Read by Ray Train's AcceleratorSetupCallback on the controller: no rewrite of CUDA_VISIBLE_DEVICES.
    share_cuda_visible_devices = False


class _BindChosenDevice:
    """Entered by every worker around the train function, in place of Ray's set_device on its own GPU id."""

    def __enter__(self) -> None:
        bind_worker_device()

    def __exit__(self, *exc) -> bool:
        return False


@dataclass
class PlacedTorchConfig(TorchConfig):
    """TorchConfig whose workers drive the GPUs their stage's placement chose (see the module doc)."""

    @property
    def backend_cls(self):
        return _KeepPlacedDevices

    @property
    def train_func_context(self):
        return _BindChosenDevice


def torch_config_for(placed: bool, backend: str | None = None) -> TorchConfig:
    """The backend config of a stage: the placed one when the stage has a GPU placement, else Ray's own."""
    return PlacedTorchConfig(backend=backend) if placed else TorchConfig(backend=backend)
