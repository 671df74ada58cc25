"""A stage's attempts: run again after a CUDA OOM with a new plan of half the micro-batch (twice the accumulation:
the same effective batch), recorded in plan.json, resuming from the newest readable checkpoint, which is checked
before every attempt (an unreadable one is set aside and the one before it resumed from).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from medgpt_ray.memory.stage_plan import halve_micro_batch
from medgpt_ray.metrics import metrics
from medgpt_ray.run.manifest import write_plan
from medgpt_ray.stages.checkpoint_check import set_aside_unreadable
from medgpt_ray.stages.inputs import StageInputs

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
    """The inputs of the next attempt after a CUDA OOM: half the micro-batch (or more checkpointing), plan.json
    rewritten; OutOfMemoryGiveUp when nothing is left to give."""
    step = int(ckpt.rsplit("-", 1)[1]) if ckpt else 0
    old = inp.plan
    plan = halve_micro_batch(old, inp.cfg, "CUDA out of memory", step)
    if plan is None:
        raise OutOfMemoryGiveUp(
            f"stage {inp.stage} ran out of GPU memory at micro-batch 1 with full checkpointing "
            f"(predicted peak {old.prediction.peak_gib if old.prediction else '?'} GiB); nothing left to give: "
            f"shorten stages.{inp.stage}.seq_len, use method qlora, or more GPUs with ZeRO-3"
        ) from err
    metrics().inc("medgpt_pipeline_oom_backoffs", 1, {"run": run_name, "stage": inp.stage})
    write_plan(inp.out, plan)
    echo(f"[{inp.stage:>3}] CUDA out of memory at micro-batch {old.micro_batch} x accum {old.grad_accum}: "
         f"backing off to {plan.micro_batch} x {plan.grad_accum}, ckpt {plan.ckpt_fraction:.0%}; "
         f"resuming from {'step ' + str(step) if ckpt else 'the start'}")
    return replace(inp, plan=plan)


def run_with_backoff(inp: StageInputs, attempt_fn: Callable[[int, StageInputs], None], run_name: str, enabled: bool,
                     echo: Callable[[str], None]) -> StageInputs:
    """Run `attempt_fn(attempt, inputs)` until it succeeds; after each CUDA OOM retry with a new, backed-off plan
    (it resumes from the newest readable checkpoint), until micro-batch 1 with full checkpointing also fails.
    Returns the inputs of the attempt that succeeded (its plan records the back-offs)."""
    attempt = 0
    usable_checkpoint(inp, echo)  # an earlier run's newest checkpoint may have been cut short
    while True:
        try:
            attempt_fn(attempt, inp)
            return inp
        except Exception as e:
            if not (enabled and is_cuda_oom(e)):
                raise
            inp = _backed_off(inp, usable_checkpoint(inp, echo), run_name, echo, e)
            attempt += 1
