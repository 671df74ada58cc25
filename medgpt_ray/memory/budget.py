"""Where the planner's per-GPU memory budget comes from: the config, the CLI, or the GPUs themselves.

GPUs are read with nvidia-smi (or NVML), never through torch: a CUDA context
on the driver would itself take ~0.5 GiB of the GPU it measures.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

# The CUDA context, NCCL and cuBLAS workspaces sit outside PyTorch's allocator (FIELD-NOTES: a 24 GB 4090
# leaves about 23.5 GiB to the allocator).
CUDA_CONTEXT_GIB = 0.5
MIB_PER_GIB = 1024


@dataclass(frozen=True)
class GPUMemory:
    name: str
    total_gib: float
    free_gib: float

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


def probe_cluster_gpu() -> GPUMemory | None:
    """The tightest GPU: read on this machine, or by a one-GPU Ray task when the driver has none."""
    import ray

    local = smallest(read_local_gpus())
    if local is not None or not ray.cluster_resources().get("GPU"):
        return local
    probe = ray.remote(num_gpus=1, num_cpus=0)(lambda: smallest(read_local_gpus()))
    return ray.get(probe.remote(), timeout=300)
