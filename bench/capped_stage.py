"""A stage module for benchmark runs under a GPU-memory cap: caps the worker's CUDA allocator, then runs the stage.

bench/real_length_throughput.py points StageInputs.module here (the module a worker imports to run its stage,
medgpt_ray/stages/__init__.py), so the stage runs through the pipeline's runner unchanged while its worker holds
no more than a 24 GiB card would. The cap travels in $MEDGPT_RAY_BENCH_GPU_CAP_GIB: run/ray_env.worker_env passes
every MEDGPT_RAY_* variable of the driver on to the Ray Train workers. Without it, or without CUDA, nothing is
capped. The hook lives here and not in the stages: a cap below the device is a benchmark's need, not a user's.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from typing import Any

CAP_ENV = "MEDGPT_RAY_BENCH_GPU_CAP_GIB"
PEAK_FILE = "bench_peak.json"  # the worker's peak allocated GiB, beside the stage's result (a stage that logs no steps)


def _stage_module(inputs: Any):
    from medgpt_ray.config import stage_kind

    return importlib.import_module(stage_kind(inputs.stage).module_name)


def _cap() -> None:
    import torch

    if os.environ.get(CAP_ENV) and torch.cuda.is_available():
        from memory_calibration import cap_allocator

        cap_allocator(float(os.environ[CAP_ENV]))
        print(f"capped_stage: this worker's CUDA allocator is capped at {os.environ[CAP_ENV]} GiB", flush=True)


def run(inputs: Any, sink: Callable[[dict[str, Any]], None] | None = None,
        callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    _cap()
    result = _stage_module(inputs).run(inputs, sink, callbacks)
    _write_peak(inputs)
    return result


def _write_peak(inputs: Any) -> None:
    import json
    from pathlib import Path

    import torch

    if torch.cuda.is_available():
        gib = torch.cuda.max_memory_allocated() / 2**30
        peak = json.dumps({"max_allocated_gib": round(gib, 3)})
        (Path(inputs.out_dir) / PEAK_FILE).write_text(peak, encoding="utf-8")


def build(inputs: Any, sink: Callable[[dict[str, Any]], None] | None = None) -> Any:
    _cap()
    return _stage_module(inputs).build(inputs, sink)
