"""OOM back-off: recognise a CUDA out-of-memory failure wherever Ray wrapped it, halve the micro-batch
(twice the accumulation: the same effective batch), record it in plan.json and resume from the last checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

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


class OutOfMemoryGiveUp(RuntimeError):
    pass


def run_with_backoff(inp, attempt_fn: Callable[[int], None], run_name: str, enabled: bool,
                     echo: Callable[[str], None]) -> None:
    """Run `attempt_fn(attempt)` until it succeeds; after each CUDA OOM back off and retry (it resumes from the
    newest checkpoint), until micro-batch 1 with full checkpointing also fails."""
    from medgpt_ray.manifest import write_json_atomic
    from medgpt_ray.memory.plan import halve_micro_batch
    from medgpt_ray.metrics import metrics
    from medgpt_ray.stages.common import latest_checkpoint

    plan, attempt = inp.plan, 0
    while True:
        try:
            attempt_fn(attempt)
            return
        except Exception as e:
            if not (enabled and is_cuda_oom(e)):
                raise
            ckpt = latest_checkpoint(inp.checkpoint_dir)
            step = int(ckpt.rsplit("-", 1)[1]) if ckpt else 0
            before = (plan.micro_batch, plan.grad_accum)
            if not halve_micro_batch(plan, inp.cfg, "CUDA out of memory", step):
                raise OutOfMemoryGiveUp(
                    f"stage {inp.stage} ran out of GPU memory at micro-batch 1 with full checkpointing "
                    f"(predicted peak {(plan.prediction or {}).get('peak_gib')} GiB); nothing left to give: "
                    f"shorten stages.{inp.stage}.seq_len, use method qlora, or more GPUs with ZeRO-3"
                ) from e
            attempt += 1
            metrics().inc("medgpt_pipeline_oom_backoffs", 1, {"run": run_name, "stage": inp.stage})
            write_json_atomic(inp.out / "plan.json", plan.to_dict())
            if plan.deepspeed is not None:
                write_json_atomic(inp.out / "deepspeed.json", plan.deepspeed)
            echo(f"[{inp.stage:>3}] CUDA out of memory at micro-batch {before[0]} x accum {before[1]}: "
                 f"backing off to {plan.micro_batch} x {plan.grad_accum}, ckpt {plan.ckpt_fraction:.0%}; "
                 f"resuming from {'step ' + str(step) if ckpt else 'the start'}")
