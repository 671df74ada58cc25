"""A stage's attempts: run again after a CUDA OOM with a new plan of half the micro-batch (twice the accumulation:
the same effective batch), recorded in the stage's backoffs.json (this module is its one writer; an interrupted
attempt resumes at the plan it left off with, resume_plan); run again after a training worker's process died, up to
`resources.worker_restarts` times; both resume from the newest readable checkpoint, which is checked before
every attempt (an unreadable one is set aside and the one before it resumed from).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from medgpt_ray.config import StageConfig
from medgpt_ray.memory.stage_plan import StagePlan, halve_micro_batch, keep_backoffs
from medgpt_ray.metrics import metrics
from medgpt_ray.run.manifest import write_json_atomic
from medgpt_ray.stages.checkpoint_check import set_aside_unreadable
from medgpt_ray.stages.inputs import StageInputs

OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED")
BACKOFFS_FILE = "backoffs.json"


def write_backoffs(stage_dir: Path, plan: StagePlan) -> None:
    """The stage's back-off history: every back-off of this attempt, each with the layout before and after it."""
    write_json_atomic(stage_dir / BACKOFFS_FILE, {"backoffs": plan.backoffs})


def read_backoffs(stage_dir: Path) -> list[dict[str, Any]]:
    path = stage_dir / BACKOFFS_FILE
    return json.loads(path.read_text(encoding="utf-8"))["backoffs"] if path.is_file() else []


def resume_plan(plan: StagePlan, stage_dir: Path, cfg: StageConfig) -> StagePlan:
    """The plan an interrupted attempt in `stage_dir` resumes with: where its OOM back-offs left it (the layout
    after the last one), when the per-worker batch is the same; else `plan`."""
    history = read_backoffs(stage_dir)
    if not history:
        return plan
    return keep_backoffs(plan, replace(plan, **history[-1]["after"], backoffs=history), cfg)


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
        # A dead worker's failed poll: WorkerHealthCheckFailedError.health_check_failure is Ray's actor error.
        for nxt in (e.__cause__, e.__context__, getattr(e, "controller_failure", None),
                    getattr(e, "health_check_failure", None)):
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


def unwritable(exc: BaseException) -> str | None:
    """"<path>: Permission denied" when a stage failed because a directory it writes could not be written (made
    read-only or immutable while it ran, a full or read-only file system); None otherwise."""
    import errno

    codes = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC)
    for e in _chain(exc):
        if isinstance(e, OSError) and (e.errno in codes or any(os.strerror(c) in str(e) for c in codes)):
            # Ray may hand the worker's error back re-raised, its errno lost: its text still names the cause
            return f"{e.filename or 'a file'}: {e.strerror or str(e).splitlines()[0][:200]}"
    return None


def worker_death(exc: BaseException) -> str | None:
    """"rank 1, pid 4321" when a training worker's process died (killed, segfault, the host's OOM killer): Ray's
    actor error for a worker in Train V2's WorkerGroupError. None for an exception the training code raised (a bug
    fails again) and for the controller's own failures."""
    from ray.exceptions import RayActorError

    for e in _chain(exc):
        for rank, failure in getattr(e, "worker_failures", {}).items():
            for f in _chain(failure):
                # actor_init_failed: the worker's constructor raised, an exception, not a death.
                if isinstance(f, RayActorError) and not f.actor_init_failed:
                    pid = re.search(r"\bpid: (\d+)", str(f))
                    return f"rank {rank}" + (f", pid {pid.group(1)}" if pid else "")
    return None


def usable_checkpoint(inp: StageInputs, echo: Callable[[str], None]) -> str | None:
    """The checkpoint the next attempt resumes from (what the workers' latest_checkpoint will pick): newer ones that
    cannot be read are renamed corrupt-checkpoint-N first, each said in one line."""
    if not inp.resume:
        return None
    aside, ckpt = set_aside_unreadable(inp.checkpoint_dir)
    for name, problem, new_name in aside:
        echo(f"[{inp.stage:>3}] {name} is unreadable ({problem}): set aside as {new_name}; "
             f"resuming from {Path(ckpt).name if ckpt else 'the start'}")
    return ckpt


class OutOfMemoryGiveUp(RuntimeError):
    pass


def _backed_off(inp: StageInputs, ckpt: str | None, run_name: str, echo: Callable[[str], None],
                err: BaseException) -> StageInputs:
    """The inputs of the next attempt after a CUDA OOM: half the micro-batch (or more checkpointing), the back-off
    recorded in backoffs.json; OutOfMemoryGiveUp when nothing is left to give (kto stops at micro-batch 2:
    halve_micro_batch)."""
    step = int(ckpt.rsplit("-", 1)[1]) if ckpt else 0
    old = inp.plan
    plan = halve_micro_batch(old, inp.cfg, "CUDA out of memory", step)
    if plan is None:
        raise OutOfMemoryGiveUp(
            f"stage {inp.stage} ran out of GPU memory at micro-batch {old.micro_batch} with full checkpointing "
            f"(predicted peak {old.prediction.peak_gib if old.prediction else '?'} GiB); nothing left to give: "
            f"shorten stages.{inp.stage}.seq_len, use method qlora, or more GPUs with ZeRO-3"
        ) from err
    metrics().inc("medgpt_pipeline_oom_backoffs", 1, {"run": run_name, "stage": inp.stage})
    write_backoffs(inp.out, plan)
    echo(f"[{inp.stage:>3}] CUDA out of memory at micro-batch {old.micro_batch} x accum {old.grad_accum}: "
         f"backing off to {plan.micro_batch} x {plan.grad_accum}, ckpt {plan.ckpt_fraction:.0%}; "
         f"resuming from {'step ' + str(step) if ckpt else 'the start'}")
    return replace(inp, plan=plan)


def run_with_backoff(inp: StageInputs, attempt_fn: Callable[[int, StageInputs], None], run_name: str, enabled: bool,
                     echo: Callable[[str], None], worker_restarts: int = 0,
                     on_plan: Callable[[StagePlan], None] | None = None,
                     worker_plan: Callable[[], StagePlan | None] | None = None) -> StageInputs:
    """Run `attempt_fn(attempt, inputs)` until it succeeds. After a CUDA OOM retry with a new, backed-off plan
    (given to `on_plan` first: run/job.py writes it to plan.json), until the smallest micro-batch with full
    checkpointing also fails (`enabled`); after a worker process died retry as is, at most `worker_restarts`
    times. Anything else is raised. Every attempt resumes from the newest readable checkpoint. Returns the inputs
    of the attempt that succeeded (its plan records the back-offs). `worker_plan()` takes the plan the workers said
    they train with, where they changed it (run/job.py): a back-off halves that one."""
    attempt = restarts = 0
    # An earlier run's newest checkpoint may have been cut short; the one the workers will load is said here (their
    # own output stays in Ray's session logs).
    start = usable_checkpoint(inp, echo)
    if start is not None:
        echo(f"[{inp.stage:>3}] resumed from {Path(start).name} (the interrupted attempt's newest checkpoint)")
    while True:
        try:
            attempt_fn(attempt, inp)
            return inp
        except Exception as e:
            oom = enabled and is_cuda_oom(e)
            died = worker_death(e) if not oom and restarts < worker_restarts else None
            if not (oom or died):
                raise
            # A worker that died while saving leaves its newest checkpoint cut short.
            ckpt = usable_checkpoint(inp, echo)
            if oom:
                changed = worker_plan() if worker_plan is not None else None
                inp = _backed_off(replace(inp, plan=changed) if changed is not None else inp, ckpt, run_name, echo, e)
                if on_plan is not None:
                    on_plan(inp.plan)
            else:
                restarts += 1
                metrics().inc("medgpt_pipeline_stage_restarts", 1, {"run": run_name, "stage": inp.stage})
                echo(f"[{inp.stage:>3}] worker died ({died}): restarting from "
                     f"{Path(ckpt).name if ckpt else 'the start'} (restart {restarts} of {worker_restarts})")
            attempt += 1
