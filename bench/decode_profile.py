"""Where a generate call's time goes (issue 35: "the remaining gap explained with a profile"): one call under
torch.profiler, summarised per decode step: wall time, the time the GPU was busy running kernels (the rest is host
overhead: Python, dispatch, kernel launches), kernel and graph launches, and the ops that took the most GPU time and
the most host time. bench/generation_throughput.py --profile [PATHS] adds one to those paths' rows (merged-static
by default)."""

from __future__ import annotations

import time
from typing import Any

TOP = 8  # ops listed per ranking


def _gpu_us(event: Any) -> float:
    # torch 2.4+ names it self_device_time_total; older ones self_cuda_time_total
    return float(getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)))


def profiled(fn: Any, device: str, steps: int) -> dict[str, Any]:
    """fn() once under torch.profiler; per decode step (`steps` of them in the call) in ms."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    wall_ms = 1000 * (time.perf_counter() - t0)
    events = prof.key_averages()
    gpu_ms = sum(_gpu_us(e) for e in events) / 1000
    launches = {e.key: e.count for e in events if e.key in ("cudaLaunchKernel", "cudaGraphLaunch", "cuLaunchKernel")}

    def top(key: Any) -> list[dict[str, Any]]:
        ranked = sorted(events, key=key, reverse=True)[:TOP]
        return [{"op": e.key, "calls_per_step": round(e.count / steps, 1),
                 "ms_per_step": round(key(e) / 1000 / steps, 3)} for e in ranked]

    return {"steps": steps, "wall_ms_per_step": round(wall_ms / steps, 3),
            "gpu_busy_ms_per_step": round(gpu_ms / steps, 3) if device == "cuda" else None,
            "gpu_busy_share": round(gpu_ms / wall_ms, 3) if device == "cuda" else None,
            "launches_per_step": {k: round(v / steps, 1) for k, v in launches.items()},
            "top_gpu_ops": top(_gpu_us) if device == "cuda" else [],
            "top_host_ops": top(lambda e: float(e.self_cpu_time_total))}
