"""Recognise a CUDA out-of-memory failure of a stage, wherever Ray wrapped it.

The back-off itself (half the micro-batch, twice the accumulation, resume from
the last checkpoint) is StagePlan's halve_micro_batch plus the pipeline's retry.
"""

from __future__ import annotations

from collections.abc import Iterator

OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        # Ray Train V2: WorkerGroupError.worker_failures maps rank -> the worker's exception.
        todo.extend(getattr(e, "worker_failures", {}).values())
        for nxt in (e.__cause__, e.__context__, getattr(e, "controller_failure", None)):
            if nxt is not None:
                todo.append(nxt)


def is_cuda_oom(exc: BaseException) -> bool:
    import torch

    for e in _chain(exc):
        if isinstance(e, torch.OutOfMemoryError):
            return True
        if any(m in str(e) for m in OOM_MARKERS):
            return True
    return False
