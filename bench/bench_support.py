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
    # Ray Data's internal actors are ray::_StatsActor and the like; ray::_warm_worker is a task.
    if any(n.startswith("ray::") and ("Actor" in n or (n.startswith("ray::_") and n[6:7].isupper())) for n in names):
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
        self._last: dict[int, tuple[float, float]] = {}
        self._groups: dict[str, float] = {}
        self._system: dict[str, float] = {}  # of which kernel time (polling, page faults, I/O)
        self._pids: dict[str, set[int]] = {}
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
            user0, system0 = self._last.get(p.pid, (0.0, 0.0))
            name = cmd.split(" ")[0] if cmd.startswith("ray::") else p.name()
            group = cpu_group({name}, cmd)
            self._groups[group] = self._groups.get(group, 0.0) + t.user - user0 + t.system - system0
            self._system[group] = self._system.get(group, 0.0) + t.system - system0
            self._pids.setdefault(group, set()).add(p.pid)
            self._last[p.pid] = (t.user, t.system)

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

    def cpu_detail(self) -> dict[str, dict[str, float]]:
        """Per group: kernel seconds and how many processes (a group of many short-lived workers pays their
        start-up; one of few long-lived ones does not)."""
        return {g: {"system_s": round(self._system.get(g, 0.0), 1), "processes": len(self._pids.get(g, ()))}
                for g in sorted(self._groups)}


    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def timeline_summary(events: list[dict], start_s: float, cpus: int) -> dict:
    """Where Ray's task time went, from ray.timeline(): per task name the count and seconds, the phases
    (argument deserialisation includes a worker's first import of the function's module), when the first
    task started after the cleaner did, and how busy the cores were between the first start and last end."""
    tasks = [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).startswith("task::")]
    if not tasks:
        return {}
    by_name: dict[str, list[float]] = {}
    for e in tasks:
        by_name.setdefault(e["name"], []).append(e["dur"] / 1e6)
    phases: dict[str, float] = {}
    slowest_deserialize = 0.0
    for e in events:
        if e.get("ph") == "X" and str(e.get("cat", "")).startswith("task:") and not e["cat"].startswith("task::"):
            phases[e["cat"]] = phases.get(e["cat"], 0.0) + e["dur"] / 1e6
            if e["cat"] == "task:deserialize_arguments":
                slowest_deserialize = max(slowest_deserialize, e["dur"] / 1e6)
    first = min(e["ts"] for e in tasks) / 1e6
    last = max(e["ts"] + e["dur"] for e in tasks) / 1e6
    busy = sum(e["dur"] for e in tasks) / 1e6
    workers_of: dict[str, set[str]] = {}
    for e in tasks:
        workers_of.setdefault(e["name"], set()).add(e["tid"])
    return {"tasks": {n: {"count": len(d), "seconds": round(sum(d), 2), "max_s": round(max(d), 2),
                          "worker_processes": len(workers_of[n])}
                      for n, d in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:8]},
            "phases_s": {k: round(v, 2) for k, v in sorted(phases.items())},
            "slowest_deserialize_s": round(slowest_deserialize, 2),
            "workers": len({e["tid"] for e in tasks}),
            "first_task_after_s": round(first - start_s, 2), "last_task_end_after_s": round(last - start_s, 2),
            "core_utilisation": round(busy / (cpus * (last - first)), 3),
            **map_phase(tasks, start_s)}


def map_phase(tasks: list[dict], start_s: float) -> dict:
    """The cleaning map tasks worker by worker: when the last worker began its first one (the start-up a job
    pays), how long workers sat idle between two of them (scheduling), and how far the last worker finished after
    the median one (the tail of uneven chunks)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for e in tasks:
        if e["name"].endswith("_map_task"):
            spans.setdefault(e["tid"], []).append((e["ts"] / 1e6 - start_s, (e["ts"] + e["dur"]) / 1e6 - start_s))
    if not spans:
        return {}
    for s in spans.values():
        s.sort()
    firsts = sorted(s[0][0] for s in spans.values())
    lasts = sorted(s[-1][1] for s in spans.values())
    gaps = [b[0] - a[1] for s in spans.values() for a, b in zip(s, s[1:], strict=False)]
    return {"map": {"workers": len(spans), "first_start_s": round(firsts[0], 2),
                    "last_worker_first_start_s": round(firsts[-1], 2), "end_s": round(lasts[-1], 2),
                    "median_worker_end_s": round(lasts[len(lasts) // 2], 2),
                    "idle_between_tasks_s": round(sum(gaps), 2), "largest_gap_s": round(max(gaps, default=0), 2)}}
