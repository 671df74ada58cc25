"""The trainer callbacks every stage runs with: progress and metrics.jsonl, telemetry, speed-ups, the OOM test hook."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from medgpt_ray.config import stage_kind
from medgpt_ray.stages import speed
from medgpt_ray.stages.inputs import Sink, StageInputs
from medgpt_ray.stages.outputs import barrier, is_rank_zero
from medgpt_ray.trainer_kit.checkpointing import SelectiveCheckpointing


def stage_callbacks(inp: StageInputs, sink: Sink | None,
                    extra: Sequence[TrainerCallback] = ()) -> list[TrainerCallback]:
    """The callbacks every stage trains with; `extra` is what the runner injects (Tune's evaluation reports)."""
    from medgpt_ray.stages.telemetry import stage_metrics_callback

    budget = inp.plan.prediction.budget_gib if inp.plan.prediction else None
    # First, so that its step-end (the first step's graph count) comes before the others read it.
    watch = speed.RecompileCount() if inp.plan.compile else None
    callbacks: list[TrainerCallback] = [*([watch] if watch else []),
                                        StageProgress(inp.stage, inp.out / "metrics.jsonl", sink, budget, watch),
                                        stage_metrics_callback(inp, watch)]
    if 0 < inp.plan.ckpt_fraction < 1:
        callbacks.append(SelectiveCheckpointing(inp.plan.ckpt_fraction))
    # Not for a kind whose trainer generates with the policy outside the Trainer's autocast (grpo, rloo), where
    # peft's fp32 cast is needed (bf16 inputs into fp32 adapters fail: the H200 run of
    # bench/real_length_throughput.py --stages grpo).
    if inp.plan.method != "full" and not stage_kind(inp.stage).generates_outside_autocast:
        callbacks.append(speed.Bf16LoraInputs())
    if inp.plan.compile:
        callbacks.append(speed.CompileDecoderLayers())
    callbacks.extend(extra)
    if os.environ.get(INJECT_OOM_ENV):
        callbacks.append(InjectedOOM(int(os.environ[INJECT_OOM_ENV])))
    if os.environ.get(PAUSE_AT_STEP_ENV):
        callbacks.append(PauseAtStep(int(os.environ[PAUSE_AT_STEP_ENV])))  # after StageProgress: step logged
    return callbacks


# Test hook for the OOM back-off: raise torch.OutOfMemoryError when this optimizer step is reached,
# once per stage directory (a marker file records that it fired, so the resumed attempt goes on).
INJECT_OOM_ENV = "MEDGPT_RAY_INJECT_OOM_AT_STEP"


class InjectedOOM(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        import torch

        marker = Path(args.output_dir).parent / ".injected_oom"
        if state.global_step >= self.step and not marker.exists():
            barrier()
            if is_rank_zero():
                marker.write_text(str(state.global_step))
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected by {INJECT_OOM_ENV} at step {self.step})")


# Test hook for a process killed mid-stage (a worker, or the driver): once the training loss of this step (or a
# later one) is logged, rank 0 writes its pid to <stage>/.paused_worker and waits there for the test to SIGKILL it
# or the driver; the other ranks wait in the next collective. Once per stage directory, like the OOM hook. A step
# after a checkpoint and before the next: the resumed attempt retrains steps the killed one logged.
PAUSE_AT_STEP_ENV = "MEDGPT_RAY_PAUSE_AT_STEP"
PAUSE_S = 120.0  # nobody came: training goes on, and the test that asked fails on what it asserts


class PauseAtStep(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_log(self, args, state, control, logs=None, **kwargs):
        marker = Path(args.output_dir).parent / ".paused_worker"
        if state.global_step >= self.step and "loss" in (logs or {}) and is_rank_zero() and not marker.exists():
            tmp = marker.with_name(marker.name + ".tmp")
            tmp.write_text(str(os.getpid()))
            os.replace(tmp, marker)
            time.sleep(PAUSE_S)


class StageProgress(TrainerCallback):
    """Rank 0 appends every log to metrics.jsonl and forwards a compact record to the sink.

    Ray Train V2 only reports metrics with a checkpoint, so per-step progress
    travels through this callback instead (ARCHITECTURE.md).
    """

    def __init__(self, stage: str, metrics_path: Path, sink: Sink | None, budget_gib: float | None = None,
                 compiles: speed.RecompileCount | None = None):
        self.stage = stage
        self.compiles = compiles  # compiled layers: every record says how many graphs were compiled after step 1
        self.budget_gib = budget_gib
        self.metrics_path = metrics_path
        self.sink = sink
        # The model is loaded and the data read: the trainer that takes these callbacks is being built.
        self._t0, self._t0_wall = time.monotonic(), time.time()
        self._train_begin_wall: float | None = None  # the trainer built (PEFT, TRL's set-up) and its train() begun
        self._last_t = self._t0
        self._last_tokens = 0
        self._first_step, self._first_step_s = 1, None  # the attempt's first step and when it ended
        self._first_step_wall: float | None = None  # that end on the wall clock, which the driver compares with its
        # stage's start line (the same clock on one node; NTP-close across nodes)

    def on_train_begin(self, args, state, control, **kwargs):
        # HF has loaded the checkpoint's TrainerState by now: global_step is the step resumed from (0 on a fresh
        # start). What a dead attempt logged after that step is trained and logged again: keep each step once.
        self._train_begin_wall = time.time()
        if state.is_world_process_zero:
            keep_steps_up_to(self.metrics_path, state.global_step)
            self._first_step = state.global_step + 1
            if self.compiles is not None and self.sink is not None:  # its first step compiles for tens of seconds
                self.sink({"stage": self.stage, "step": state.global_step, "total_steps": state.max_steps,
                           "phase": "compiling"})

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self._first_step:  # the attempt's first step: compiling, autotuning, warm-up
            self._first_step_s = round(time.monotonic() - self._t0, 3)
            self._first_step_wall = time.time()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        now = time.monotonic()
        tokens = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        dt = max(now - self._last_t, 1e-9)
        record: dict[str, Any] = {
            "stage": self.stage,
            "step": state.global_step,
            "total_steps": state.max_steps,
            "time_s": round(now - self._t0, 3),
            **({"first_step": self._first_step, "first_step_s": self._first_step_s,
                "first_step_wall": self._first_step_wall, "model_and_data_wall": self._t0_wall,
                "trainer_built_wall": self._train_begin_wall}
               if self._first_step_s is not None else {}),
            **{k: v for k, v in logs.items() if isinstance(v, int | float)},
        }
        if self.compiles is not None and self.compiles.recompiles is not None:
            record["recompiles"] = self.compiles.recompiles
        gpu = _gpu_peak_gib()
        if gpu is not None:
            record["gpu_peak_gib"] = round(gpu, 3)
            if self.budget_gib:
                record["gpu_budget_gib"] = self.budget_gib
        if "loss" in logs:
            # num_input_tokens_seen already sums every rank's tokens (the Trainer gathers them): the job's rate.
            record["tokens_per_s"] = (tokens - self._last_tokens) / dt
            self._last_t, self._last_tokens = now, tokens
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        with self.metrics_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        if self.sink is not None:
            self.sink(record)


def keep_steps_up_to(path: Path, step: int) -> None:
    """Rewrite metrics.jsonl atomically with only the records of steps <= `step`. A line cut short (the process
    died while writing it) goes too."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line + "\n")
        except (ValueError, KeyError, TypeError):
            continue
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


def _gpu_peak_gib() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
