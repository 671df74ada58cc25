"""The planner's per-GPU memory Budget, and where it comes from: the config, the CLI, or the GPUs themselves.

GPUs are read with nvidia-smi (or NVML), never through torch: a CUDA context
on the driver would itself take ~0.5 GiB of the GPU it measures.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from medgpt_ray.config import ConfigError, PipelineConfig
from medgpt_ray.memory.throughput import GPU_SPECS, GPUSpec, spec_for

# The CUDA context, NCCL and cuBLAS workspaces sit outside PyTorch's allocator (FIELD-NOTES: a 24 GB 4090
# leaves about 23.5 GiB to the allocator).
CUDA_CONTEXT_GIB = 0.5
MIB_PER_GIB = 1024


@dataclass(frozen=True)
class GPUMemory:
    name: str
    total_gib: float
    free_gib: float
    # The node the GPU is in: its available RAM (for CPU offload) and how many GPUs share that RAM.
    host_available_gib: float | None = None
    gpus_on_node: int | None = None

    @property
    def allocator_gib(self) -> float:
        """What a new training process's allocator can use: the free memory less its own CUDA context."""
        return min(self.total_gib - CUDA_CONTEXT_GIB, self.free_gib - CUDA_CONTEXT_GIB)


def read_local_gpus() -> list[GPUMemory]:
    """Every GPU this process can see (honouring CUDA_VISIBLE_DEVICES is the caller's business)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=20, check=True).stdout
        except (subprocess.SubprocessError, OSError):
            out = ""
        gpus = []
        for line in out.strip().splitlines():
            parts = [p.strip() for p in line.rsplit(",", 2)]
            if len(parts) == 3:
                gpus.append(GPUMemory(parts[0], float(parts[1]) / MIB_PER_GIB, float(parts[2]) / MIB_PER_GIB))
        if gpus:
            return gpus
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            gpus.append(GPUMemory(name if isinstance(name, str) else name.decode(), mem.total / 2**30,
                                  mem.free / 2**30))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def smallest(gpus: list[GPUMemory]) -> GPUMemory | None:
    """A stage must fit its tightest GPU."""
    return min(gpus, key=lambda g: g.allocator_gib) if gpus else None


def read_host_available_gib(meminfo: str = "/proc/meminfo") -> float | None:
    """MemAvailable of this machine (Linux); None where there is no /proc/meminfo."""
    try:
        text = Path(meminfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20  # kB
    return None


def tightest_local_gpu() -> GPUMemory | None:
    """This machine's tightest GPU, with the machine's available RAM and GPU count."""
    gpus = read_local_gpus()
    g = smallest(gpus)
    return None if g is None else replace(g, host_available_gib=read_host_available_gib(), gpus_on_node=len(gpus))


HOST_RAM_FOR_OFFLOAD = 0.8  # share of a node's available RAM that CPU offload may take


@dataclass(frozen=True)
class Budget:
    """Per-GPU memory for the allocator, less a safety margin; None plans without a memory limit (CPU)."""

    gpu_gib: float | None
    margin_gib: float
    gpu: GPUSpec
    source: str
    # Host RAM available on each GPU node and its GPU count, for CPU offload; None: unknown, not checked.
    host_gib: float | None = None
    gpus_per_node: int | None = None
    # A CPU run's limit: host RAM per worker (None: not known, not checked). Not a GPU budget: no GPU gauges.
    cpu_ram_gib: float | None = None
    # What the GPU's probe of the linear-attention kernels found (hybrid/kernels.KernelProbe.as_dict), for a hybrid
    # model's plan; None: not probed (a dense model, a CPU run, or a budget given in the config).
    linear_kernels: dict[str, Any] | None = None

    @property
    def usable_gib(self) -> float:
        if self.gpu_gib is None:
            return float("inf") if self.cpu_ram_gib is None else self.cpu_ram_gib
        return self.gpu_gib - self.margin_gib

    @property
    def host_usable_gib(self) -> float:
        # The rest stays for the OS, Ray's object store, data loading and each worker's model load.
        return float("inf") if self.host_gib is None else self.host_gib * HOST_RAM_FOR_OFFLOAD

    def workers_per_node(self, num_workers: int) -> int:
        return min(num_workers, self.gpus_per_node or num_workers)

    def describe(self) -> str:
        if self.gpu_gib is None:
            if self.cpu_ram_gib is None:
                return "no memory limit (CPU; host RAM unknown)"
            return f"{gib(self.cpu_ram_gib)} of host RAM per worker (CPU: {self.source})"
        host = "" if self.host_gib is None else f"; host RAM for offload {gib(self.host_usable_gib)} per node"
        return (f"{gib(self.usable_gib)} = {gib(self.gpu_gib)} ({self.source}) - "
                f"{gib(self.margin_gib)} margin, {self.gpu.name}{host}")


def make_budget(gpu_gib: float | None, margin_gib: float, gpu_type: str, use_gpu: bool, source: str,
                detected_name: str | None = None, host_gib: float | None = None,
                gpus_per_node: int | None = None) -> Budget:
    if gpu_type != "auto":
        try:
            spec = spec_for(gpu_type)
        except KeyError as e:
            raise ConfigError(f"resources.gpu_type: {e.args[0]}") from None
    elif detected_name:
        try:
            spec = spec_for(detected_name)
        except KeyError:
            spec = GPU_SPECS["rtx4090"]
    else:
        spec = GPU_SPECS["rtx4090"] if use_gpu else GPU_SPECS["cpu"]
    return Budget(gpu_gib, margin_gib, spec, source, host_gib, gpus_per_node)


def gib(x: float) -> str:
    return f"{x:.2f} GiB" if x < 10 else f"{x:.1f} GiB"


GpuProbe = Callable[[], GPUMemory | None]


def cpu_budget(host_gib: float | None, num_workers: int, where: str) -> Budget:
    """A CPU run's workers share the host's RAM: each may use HOST_RAM_FOR_OFFLOAD of it over their number (the
    rest for the OS, Ray and data loading), checked against the same peak prediction as a GPU's memory."""
    budget = make_budget(None, 0.0, "auto", False, "cpu")
    if host_gib is None:
        return budget
    return replace(budget, cpu_ram_gib=round(host_gib * HOST_RAM_FOR_OFFLOAD / max(1, num_workers), 2),
                   source=f"80 % of {host_gib:.1f} GiB host RAM available ({where}) shared by {num_workers} worker(s)")


def resolve_budget(cfg: PipelineConfig, probe: GpuProbe | None, default_gpu_gib: float | None) -> Budget:
    r = cfg.resources
    # Host RAM for CPU offload: the config's, else what was read on a GPU node (never this laptop's when the
    # GPU side comes from the config).
    host = {"host_gib": r.host_memory_gib, "gpus_per_node": r.gpus_per_node}
    if r.gpu_memory_gib is not None:
        return make_budget(r.gpu_memory_gib, r.memory_margin_gib, r.gpu_type, r.use_gpu, "resources.gpu_memory_gib",
                           **host)
    if not r.use_gpu:
        return cpu_budget(r.host_memory_gib if r.host_memory_gib is not None else read_host_available_gib(),
                          r.num_workers, "resources.host_memory_gib" if r.host_memory_gib is not None else "read here")
    gpu = (probe or tightest_local_gpu)()
    if gpu is not None:
        return make_budget(round(gpu.allocator_gib, 2), r.memory_margin_gib, r.gpu_type, True,
                           f"{gpu.name}: {gpu.free_gib:.1f} GiB free of {gpu.total_gib:.1f}, less the CUDA context",
                           detected_name=gpu.name,
                           host_gib=r.host_memory_gib if r.host_memory_gib is not None else gpu.host_available_gib,
                           gpus_per_node=r.gpus_per_node or gpu.gpus_on_node)
    if default_gpu_gib is None:
        raise ConfigError("resources.gpu_memory_gib: no GPU could be read to size the plan; set it to the "
                          "per-GPU memory of the cluster's cards (e.g. 24 for an RTX 4090)")
    return make_budget(default_gpu_gib, r.memory_margin_gib, r.gpu_type, True, "assumed: no GPU here", **host)
