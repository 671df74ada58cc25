"""Live progress through a small named actor: Ray workers (stage workers, cleaning tasks) push records that the
driver polls. Ray Train V2 reports metrics only with checkpoints, so per-step records travel this way
(ARCHITECTURE.md).

It stays at the package's top level, not in run/, because data/clean.py (LiveProgress) uses it and data/ may not
import run/; the pipeline's printer and summary are in run/progress.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import ray


@ray.remote(num_cpus=0)
class ProgressActor:
    def __init__(self) -> None:
        self._records: list[dict[str, Any]] = []

    def push(self, record: dict[str, Any]) -> None:
        self._records.append(record)

    def drain(self) -> list[dict[str, Any]]:
        out, self._records = self._records, []
        return out


def format_eta(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def progress_line(rec: dict[str, Any]) -> str:
    step, total = rec.get("step", 0), rec.get("total_steps") or 0
    eta = rec["time_s"] / step * (total - step) if step and total else None
    parts = [f"[{rec.get('stage', '?'):>3}] step {step}/{total}"]
    if "loss" in rec:
        parts.append(f"loss {rec['loss']:.4f}")
    if "tokens_per_s" in rec:
        parts.append(f"{rec['tokens_per_s']:,.0f} tok/s")
    if "learning_rate" in rec:
        parts.append(f"lr {rec['learning_rate']:.2e}")
    if "gpu_peak_gib" in rec:
        budget = f"/{rec['gpu_budget_gib']:.1f}" if rec.get("gpu_budget_gib") else ""
        parts.append(f"mem {rec['gpu_peak_gib']:.1f}{budget} GiB")
    parts.append(f"ETA {format_eta(eta)}")
    return "  ".join(parts)


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
