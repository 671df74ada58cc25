"""A wave of the pipeline: its stages placed together, each run as a StageJob in a thread of its own (side by side
when the cluster has room for all of them, else one after the other), progress printed while they run, and each
finished stage recorded in the manifest."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray

from medgpt_ray.config import PipelineConfig, stage_kind
from medgpt_ray.memory.stage_plan import StagePlan
from medgpt_ray.metrics import metrics, set_stage_state
from medgpt_ray.placement.topology import Topology
from medgpt_ray.run import eval_report
from medgpt_ray.run.backoff import unwritable
from medgpt_ray.run.gpu_placement import find_topology, place_wave
from medgpt_ray.run.job import StageJob
from medgpt_ray.run.manifest import Manifest, write_json_atomic
from medgpt_ray.run.outcomes import StageOutcome
from medgpt_ray.run.progress import ProgressActor, ProgressPrinter, overlong_warning, result_brief
from medgpt_ray.run.stage_runner import RayOptions, run_stage_on_ray, run_task_on_ray
from medgpt_ray.run.upstream import PipelineError
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.stages.outputs import latest_checkpoint
from medgpt_ray.stages.packing import WORKER_PLAN

# A stage's start-up, in order: the driver calls Ray Train's fit() (the driver's own work after the start line
# done), then as its rank-0 worker stamps it: its process starts (Ray Train's controller and worker actors spawned),
# it enters our train function (Ray's worker bootstrap and the imports unpickling it pulls in), it is up (our worker
# set-up done), its model is loaded and data read, its trainer built and train() begun, its first step ended
# (compiled, or the compile caches loaded).
STARTUP_MARKS = ("fit", "worker_process", "train_fn", "worker_up", "model_and_data", "trainer_built", "first_step")


def startup_seconds(marks: dict[str, float], started: float) -> dict[str, float]:
    """Seconds from the stage's start line to each start-up mark its worker reported; none where a mark lies before
    the start line (a worker on another node whose clock is behind the driver's). A worker process that started
    before the line is one Ray reused: that mark alone is left out."""
    marks = {m: t for m, t in marks.items() if not (m == "worker_process" and t < started)}
    if any(marks[m] < started for m in marks):
        return {}
    return {f"{m}_s": round(marks[m] - started, 1) for m in STARTUP_MARKS if m in marks}


@dataclass
class Progress:
    """The run's progress actor (workers push per-step records) and the printer the driver feeds from it; a record
    of the plan a worker trains with (stages/packing.py) goes to its stage's job instead (`plans`), which writes it."""

    actor: Any
    name: str
    namespace: str
    printer: ProgressPrinter
    plans: dict[str, Callable[[dict[str, Any]], None]] = field(default_factory=dict)
    # Each stage's start-up on the wall clock, as its rank-0 worker reported it (STARTUP_MARKS; the latest attempt's:
    # a back-off or resume starts over)
    startup: dict[str, dict[str, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def poll(self) -> None:
        with self._lock:  # the waiting thread polls, and each stage's thread after an attempt
            records = ray.get(self.actor.drain.remote())
            for rec in records:
                if WORKER_PLAN in rec and rec.get("stage") in self.plans:
                    self.plans[rec["stage"]](rec[WORKER_PLAN])
                marks = {m: rec[f"{m}_wall"] for m in STARTUP_MARKS if rec.get(f"{m}_wall") is not None}
                if marks:
                    self.startup.setdefault(rec["stage"], {}).update(marks)
            self.printer.feed([rec for rec in records if WORKER_PLAN not in rec])


@contextmanager
def progress_channel(cfg: PipelineConfig, echo) -> Iterator[Progress]:
    namespace = ray.get_runtime_context().namespace
    name = f"medgpt-progress-{cfg.name}-{os.getpid()}"
    progress = Progress(ProgressActor.options(name=name, namespace=namespace).remote(), name, namespace,
                        ProgressPrinter(cfg.progress_every, echo=echo))
    try:
        yield progress
    finally:
        progress.poll()
        ray.kill(progress.actor)


def start_line(job: StageJob, inp: StageInputs) -> str:
    p = inp.plan
    how = (f"{p.method}, {p.precision}, {p.num_workers} worker(s) x micro-batch {p.micro_batch} x accum "
           f"{p.grad_accum}, ZeRO {p.zero_stage}, model" if stage_kind(job.stage).trains else
           f"one Ray task on {'a GPU' if p.use_gpu else 'CPU'}, reading {', '.join(inp.needs)} "
           f"and the reference model")
    return f"[{job.stage:>3}] start: {how} {inp.model_path}"


class WaveRunner:
    """Runs the waves of one pipeline run; `interrupted` is set on Ctrl-C (a stage that then fails, its actors
    going down with the driver, is no failure)."""

    def __init__(self, cfg: PipelineConfig, manifest: Manifest, storage_path: str, progress: Progress, echo,
                 interrupted: threading.Event):
        self.cfg, self.manifest, self.storage_path, self.progress = cfg, manifest, storage_path, progress
        self.echo, self.interrupted = echo, interrupted
        self._topo: Topology | None = None

    def _fits_side_by_side(self, stages: list[str], inputs: dict[str, StageInputs]) -> bool:
        if len(stages) < 2:
            return False
        avail = ray.available_resources()
        plans = [inputs[s].plan for s in stages]
        need_cpu = sum(p.num_workers * self.cfg.resources.cpus_per_worker for p in plans)
        need_gpu = sum(p.num_workers for p in plans if p.use_gpu)
        return need_cpu <= avail.get("CPU", 0) and need_gpu <= avail.get("GPU", 0)

    def _placed(self, stages: list[str], inputs: dict[str, StageInputs], parallel: bool) -> dict[str, StageInputs]:
        if not any(inputs[s].plan.use_gpu for s in stages):
            return inputs
        if self._topo is None:
            self._topo = find_topology(self.cfg)
        plans = place_wave(self.cfg, self._topo, stages, {s: inputs[s].plan for s in stages}, parallel, self.echo)
        return {s: replace(inputs[s], plan=plans[s]) for s in stages}

    def run(self, jobs: dict[str, StageJob], inputs: dict[str, StageInputs], fingerprints: dict[str, str]
            ) -> dict[str, StageOutcome]:
        """The wave's stages (the keys of `jobs`) run; their outcomes."""
        stages = list(jobs)
        parallel = self._fits_side_by_side(stages, inputs)
        if parallel:
            self.echo(f"running {' and '.join(stages)} side by side")
        inputs = self._placed(stages, inputs, parallel)
        results: dict[str, StageOutcome] = {}
        threads: dict[str, threading.Thread] = {}
        for s in stages:
            threads[s] = threading.Thread(target=self._work, args=(jobs[s], inputs[s], fingerprints[s], results),
                                          name=f"stage-{s}", daemon=True)
            threads[s].start()
            if not parallel:
                self._wait(threads[s])
        for t in threads.values():
            self._wait(t)
        return {s: results[s] for s in stages}

    def _wait(self, thread: threading.Thread) -> None:
        while thread.is_alive():
            thread.join(timeout=1.0)
            self.progress.poll()

    def _work(self, job: StageJob, inp: StageInputs, fingerprint: str, results: dict[str, StageOutcome]) -> None:
        stage, t0, started = job.stage, time.monotonic(), time.time()
        self.progress.startup.pop(stage, None)
        self.echo(start_line(job, inp))
        tags = {"run": self.cfg.name, "stage": stage}
        set_stage_state(self.cfg.name, stage, "running")
        if latest_checkpoint(inp.checkpoint_dir):
            metrics().inc("medgpt_pipeline_stage_restarts", 1, tags)  # resuming an interrupted attempt
        self.progress.plans[stage] = job.take_worker_plan
        try:
            plan = job.run(inp, self._attempt_fn(stage, fingerprint))  # with the back-offs it took
            result = self._record(stage, inp, plan, fingerprint,
                                  startup_seconds(self.progress.startup.get(stage, {}), started))
            results[stage] = StageOutcome(stage, "done", result, time.monotonic() - t0)
            eval_report.publish(self.cfg.name, result)
            self.echo(f"[{stage:>3}] done in {results[stage].wall_s:.1f}s: {result_brief(result)}")
            for line in overlong_warning(stage, result):
                self.echo(line)
        except Exception as e:  # reported in the summary and re-raised by the pipeline as PipelineError
            if self.interrupted.is_set():
                return  # the run was cut by Ctrl-C and says so; this is its Ray work going down with it
            blocked = unwritable(e)  # one line that says what to fix, not the workers' traceback
            error = f"cannot write {blocked}: make it writable, then re-run the same command to resume" if blocked \
                else f"{type(e).__name__}: {e}"
            results[stage] = StageOutcome(stage, "failed", {}, time.monotonic() - t0, error)
            self.echo(f"[{stage:>3}] FAILED after {results[stage].wall_s:.1f}s: {results[stage].error}")
        set_stage_state(self.cfg.name, stage, results[stage].status)
        metrics().set("medgpt_pipeline_stage_wall_seconds", results[stage].wall_s, tags)

    def _attempt_fn(self, stage: str, fingerprint: str) -> Callable[[int, StageInputs], None]:
        name = f"{self.cfg.name}-{stage}-{fingerprint[:10]}"
        runner = run_stage_on_ray if stage_kind(stage).trains else run_task_on_ray
        progress = (self.progress.name, self.progress.namespace)

        def attempt(n: int, inp: StageInputs) -> None:
            try:
                runner(inp, RayOptions(self.storage_path, name + (f"-b{n}" if n else ""),
                                       self.cfg.resources.cpus_per_worker, progress=progress))
            finally:  # a plan the workers changed reaches the job before it backs off or records the stage
                self.progress.poll()

        return attempt

    def _record(self, stage: str, inp: StageInputs, plan: StagePlan, fingerprint: str,
                startup: dict[str, float]) -> dict[str, Any]:
        """The finished stage's result.json, recorded in the manifest once its model is there; with the seconds from
        its start line to each start-up mark where it trained (`startup_s`; `first_step_after_start_s` is the last:
        what a user waits before the first progress line)."""
        path = Path(inp.out_dir) / "result.json"
        result = json.loads(path.read_text(encoding="utf-8"))
        if stage_kind(stage).trains and not Path(result["output_model"], "config.json").is_file():
            raise PipelineError(f"stage {stage} finished without a model in {result['output_model']}")
        if startup:
            result["startup_s"] = startup
            if "first_step_s" in startup:
                result["first_step_after_start_s"] = startup["first_step_s"]
            write_json_atomic(path, result, mode=path.stat().st_mode & 0o777)  # the workers' 077 kept
        self.manifest.record(stage, {
            "fingerprint": fingerprint, "output_model": result["output_model"], "plan": plan.to_dict(),
            "result": result, "workers": result.get("workers", []),
        })
        return result
