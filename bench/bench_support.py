"""What the data benchmarks share: the cached dirty corpus, and a sampler of the RSS and CPU seconds of a process
and its descendants (the Ray workers)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent


def corpus(records: int, work: Path) -> Path:
    path = work / f"dirty_{records}.jsonl"
    if not path.is_file():
        work.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")  # an interrupted generation must not pass for a corpus
        subprocess.run([sys.executable, str(REPO / "bench" / "make_dirty_corpus.py"), "--records", str(records),
                        "--out", str(tmp)], check=True, stdout=subprocess.DEVNULL)
        tmp.rename(path)
    return path



def cpu_group(names: set[str], cmd: str) -> str:
    """Where a process's CPU time counts: the driver, Ray's task workers, actors (Ray Data's _StatsActor and
    autoscaling coordinator, our progress actor), or Ray's own daemons."""
    if any(n.startswith("ray::") and ("Actor" in n or n.startswith("ray::_")) for n in names):
        return "actors"
    if any(n.startswith("ray::") for n in names):
        return "task_workers"
    for daemon in ("raylet", "gcs_server", "dashboard", "log_monitor", "runtime_env", "agent"):
        if daemon in cmd:
            return "ray_daemons"
    return "other"


class PeakRSS:
    """Samples the RSS of this process and of every descendant (the Ray workers) twice a second, and the CPU
    seconds each of them used (grouped by cpu_group at the end: what shares the cores with the cleaning)."""

    def __init__(self) -> None:
        self.driver = 0
        self.worker = 0
        self.total = 0
        self._last: dict[int, float] = {}
        self._groups: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample_cpu(self, procs: list[psutil.Process]) -> None:
        """CPU time used since the last sample, counted under the role the process has now: Ray reuses a worker
        process for tasks and later for an actor, so a process's whole life cannot go to one group."""
        for p in procs:
            try:
                cmd = " ".join(p.cmdline())
                t = p.cpu_times()
            except psutil.Error:
                continue
            now = t.user + t.system
            name = cmd.split(" ")[0] if cmd.startswith("ray::") else p.name()
            group = cpu_group({name}, cmd)
            self._groups[group] = self._groups.get(group, 0.0) + now - self._last.get(p.pid, 0.0)
            self._last[p.pid] = now

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            try:
                kids = me.children(recursive=True)
                driver = me.memory_info().rss
                workers = [k.memory_info().rss for k in kids if "ray::" in " ".join(k.cmdline()[:1])
                           or k.name().startswith("ray::")]
                self.driver = max(self.driver, driver)
                self.worker = max(self.worker, max(workers, default=0))
                self.total = max(self.total, driver + sum(k.memory_info().rss for k in kids))
                self._sample_cpu(kids)
            except psutil.Error:
                pass
            time.sleep(0.5)

    def cpu_seconds(self) -> dict[str, float]:
        t = psutil.Process().cpu_times()
        groups = {"driver": t.user + t.system, **self._groups}
        return {k: round(v, 1) for k, v in sorted(groups.items())}

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
