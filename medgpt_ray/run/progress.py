"""What the drivers print while Ray works: a progress line every few steps per stage, a line per finished stage,
the run's summary table, and the cleaner's live line.

Live progress goes through a small named actor: Ray workers (stage workers, cleaning tasks) push records that
the driver polls. Ray Train V2 reports metrics only with checkpoints, so per-step records travel this way
(ARCHITECTURE.md).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import ray

from medgpt_ray.progress import format_eta, progress_line
from medgpt_ray.run.eval_report import format_eval_lines
from medgpt_ray.run.pair_report import format_pair_line
from medgpt_ray.stages import overlong
from medgpt_ray.stages.outputs import HELD_OUT


@ray.remote(num_cpus=0)
class ProgressActor:
    def __init__(self) -> None:
        self._records: list[dict[str, Any]] = []

    def push(self, record: dict[str, Any]) -> None:
        self._records.append(record)

    def drain(self) -> list[dict[str, Any]]:
        out, self._records = self._records, []
        return out



class ProgressPrinter:
    """Prints one line every `every` steps per stage (and the first and last), never raw worker bars."""

    def __init__(self, every: int, echo=print):
        self.every = every
        self.echo = echo
        self._last_printed: dict[str, int] = {}

    def feed(self, records: list[dict[str, Any]]) -> None:
        for rec in records:
            if rec.get("phase") == "compiling":
                self.echo(progress_line(rec))
                continue
            if "loss" not in rec:
                continue
            stage, step = rec.get("stage", "?"), int(rec.get("step", 0))
            last = self._last_printed.get(stage)
            if last is None or step - last >= self.every or step == rec.get("total_steps"):
                self._last_printed[stage] = step
                self.echo(progress_line(rec))


def result_brief(r: dict[str, Any]) -> str:
    parts = [f"{r.get('steps')} steps"] if r.get("steps") is not None else []
    if r.get("first_step_after_start_s") is not None:  # the wait before the first progress line, cold or warm
        up = r.get("startup_s", {})
        where = (f" (worker up {up['worker_up_s']:.1f}s, trainer built {up['trainer_built_s']:.1f}s)"
                 if {"worker_up_s", "trainer_built_s"} <= set(up) else "")
        parts.append(f"first step {r['first_step_after_start_s']:.1f}s after the start line{where}")
    if r.get("evaluation"):  # the eval stage: what it compared
        ev = r["evaluation"]
        parts.append(f"{len(ev['models'])} models on {ev['data']['prompts']} prompts and "
                     f"{ev['data']['exam_questions']} exam questions")
    if r.get("train_loss_first") is not None:
        parts.append(f"loss {r['train_loss_first']:.3f} -> {r['train_loss_last']:.3f}")
    parts += [f"{k} {v:.3f}" for k, v in r.get(HELD_OUT, {}).items() if isinstance(v, float)]
    if r.get("recompiles") is not None:  # compiled layers only
        parts.append(f"{r['recompiles']} recompiles after step 1")
    if r.get("overlong"):  # records longer than seq_len: truncated and skipped, by the stage's `overlong`
        parts.append(overlong.brief(r["overlong"]))
    return ", ".join(parts)


def overlong_warning(stage: str, r: dict[str, Any]) -> list[str]:
    """The warning line when more than 5 % of a stage's records were truncated or skipped (none otherwise)."""
    line = overlong.warning_line(stage, r["overlong"]) if r.get("overlong") else None
    return [line] if line else []


def summary_entry(status: str, r: dict[str, Any], wall_s: float | None, error: str | None) -> dict[str, Any]:
    """A stage's row of summary.json, from its result (this run's, or the manifest's for a skipped stage)."""
    entry = {"status": status, "steps": r.get("steps"), "wall_s": wall_s, "train_loss_first": r.get("train_loss_first"),
             "train_loss_last": r.get("train_loss_last"), HELD_OUT: r.get(HELD_OUT, {}),
             "output_model": r.get("output_model"), "error": error}
    if r.get("recompiles") is not None:  # compiled layers: graphs compiled after the first step
        entry["recompiles"] = r["recompiles"]
    if r.get("overlong"):  # records longer than seq_len, counted (stages/overlong.py)
        entry["overlong"] = r["overlong"]
    return entry


def format_summary(summary: dict[str, Any]) -> str:
    # The recompiles column only when some stage ran compiled layers (stages/speed.py RecompileCount).
    compiled = any(st.get("recompiles") is not None for st in summary["stages"].values())
    recompiles = f"{'recomp':>7}" if compiled else ""
    head = f"{'stage':<6}{'status':<10}{'steps':>6}{'wall s':>9}{recompiles}  {'loss first -> last':<20}  eval"
    lines = [f"summary of run '{summary['name']}' ({summary['wall_s']:.0f}s)", head, "-" * len(head)]
    # A disabled stage has nothing to report: one line names them and how to turn one on, not a row each.
    off = [s for s, st in summary["stages"].items() if st["status"] == "disabled"]
    for s, st in summary["stages"].items():
        if st["status"] == "disabled":
            continue
        loss = (f"{st['train_loss_first']:.3f} -> {st['train_loss_last']:.3f}"
                if st.get("train_loss_first") is not None else "")
        ev = ", ".join(f"{k.removeprefix('eval_')}={v:.3f}" for k, v in (st.get(HELD_OUT) or {}).items()
                       if isinstance(v, float))
        wall = f"{st['wall_s']:.1f}" if isinstance(st.get("wall_s"), float | int) else ""
        rc = f"{st['recompiles'] if st.get('recompiles') is not None else '':>7}" if compiled else ""
        lines.append(f"{s:<6}{st['status']:<10}{st.get('steps') or '':>6}{wall:>9}{rc}  {loss:<20}  {ev}")
    if off:
        lines.append(f"not enabled: {', '.join(off)} (stages.<kind>.enabled: true runs one)")
    lines += [pair] if (pair := format_pair_line(summary)) else []
    lines += format_eval_lines(summary)
    lines.append(f"run directory: {summary['run_dir']}  (summary.json, manifest.json, <stage>/plan.json)")
    return "\n".join(lines)


class LiveProgress:
    """While the cleaner reads and cleans, one line every few seconds: files, chunks done, records read,
    records/s and, once a chunk is done, the ETA (from the bytes of the chunks done, as the record total is
    unknown until everything is read).

    Ray Data tasks push counts to a ProgressActor named by `address`; a driver thread prints."""

    def __init__(self, chunks: int, t0: float, echo: Callable[[str], None], every_s: float = 5.0,
                 files: int = 1, total_bytes: int = 0):
        name = f"medgpt-clean-progress-{os.getpid()}-{time.monotonic_ns()}"
        namespace = ray.get_runtime_context().namespace
        self.actor = ProgressActor.options(name=name, namespace=namespace).remote()
        self.address = (name, namespace)
        self.chunks, self.t0, self.echo, self.every_s = chunks, t0, echo, every_s
        self.files, self.total_bytes = files, total_bytes
        self.rows = self.done = self.bytes_done = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="clean-progress", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=30)
        self._poll()
        ray.kill(self.actor)
        return False

    def _poll(self) -> None:
        for rec in ray.get(self.actor.drain.remote()):
            self.rows += rec.get("rows", 0)
            self.done += rec.get("chunk_done", 0)
            self.bytes_done += rec.get("bytes", 0)

    def line(self, now: float) -> str:
        dt = max(now - self.t0, 1e-9)
        eta = None
        if self.total_bytes and 0 < self.bytes_done < self.total_bytes:
            eta = dt * (self.total_bytes - self.bytes_done) / self.bytes_done
        return (f"[clean] 1/3 {self.files} file(s), {self.done}/{self.chunks} chunks, {self.rows:,} records read "
                f"({self.rows / dt:,.0f}/s){'' if eta is None else ', ETA ' + format_eta(eta)}")

    def _loop(self) -> None:
        last = -1
        while not self._stop.wait(self.every_s):
            self._poll()
            if self.rows != last:
                last = self.rows
                self.echo(self.line(time.monotonic()))
