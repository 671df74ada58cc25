"""Starting the tests' shared local Ray cluster so that a failed start says why.

A CI run once lost every Ray test to one `ray.init` whose raylet did not register within Ray's fixed 30 s
("The current node timed out during startup"); the cluster's temp dir, and with it the raylet's own logs, was
deleted at teardown, so nothing said why. One way to get exactly that, reproduced here: a metrics port chosen by
free_port() and taken by another socket before Ray's agent binds it. The agent dies on EADDRINUSE and the raylet
with it. The shared cluster now leaves that port to Ray (port 0: no race). Should a start still fail, this prints
the tails of the cluster's Ray logs (Ray's own lines: no record of ours is in them) and the load average, kills
only the processes of that cluster (found by its own temp dir in their command lines), and tries once more on a
fresh temp dir and fresh ports. A second failure raises, with both reports attached.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

# Ray's logs that tell why a node did not come up, in the order they are worth reading.
STARTUP_LOGS = ("raylet.err", "raylet.out", "gcs_server.err", "gcs_server.out", "dashboard_agent.err",
                "dashboard_agent.log", "runtime_env_agent.err", "dashboard.err")
TAIL_LINES = 25
ATTEMPTS = 2


class RayStartupError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_temp_root() -> Path:
    """A fresh, short temp dir for one Ray cluster a test starts (Ray's AF_UNIX socket paths stop at 107 bytes).
    Another Ray cluster on this machine keeps /tmp/ray and its files: a test never reads those."""
    return Path(tempfile.mkdtemp(prefix="mgr-", dir="/tmp"))


def log_tails(temp_dir: Path) -> str:
    """The last lines of the Ray logs under `temp_dir` that say why its node did not start."""
    parts = [f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"]
    logs_dirs = sorted(temp_dir.glob("session_*/logs"), key=lambda p: p.stat().st_mtime)
    if not logs_dirs:
        return "\n".join(parts + [f"no Ray session logs under {temp_dir}"])
    for name in STARTUP_LOGS:
        path = logs_dirs[-1] / name
        if path.is_file() and path.stat().st_size:
            lines = path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
            parts.append(f"--- {path.name} (last {len(lines)} lines)\n" + "\n".join(lines))
    return "\n".join(parts)


def pids_started_under(temp_dir: Path) -> list[int]:
    """Processes whose command line names `temp_dir`: the GCS, raylet and agents of the cluster started there
    (each is passed its session dir). Another cluster on this machine has its own temp dir and is never named."""
    needle = str(temp_dir).encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:  # the process ended while we looked
            continue
    return pids


def kill_cluster_under(temp_dir: Path) -> None:
    for pid in pids_started_under(temp_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_shared_cluster(init: Callable[[Path], None]) -> Path:
    """Run `init(temp_dir)` (a `ray.init` on that temp dir and fresh ports) until one starts; the temp dir of
    the cluster that did. Only Ray's node-startup failure is retried; any other error goes up at once."""
    import ray

    reports = []
    for attempt in range(1, ATTEMPTS + 1):
        temp_dir = ray_temp_root()
        started = time.monotonic()
        try:
            init(temp_dir)
            return temp_dir
        except Exception as err:
            if "timed out during startup" not in str(err):
                raise
            report = f"attempt {attempt}: {err} after {time.monotonic() - started:.0f} s\n{log_tails(temp_dir)}"
            reports.append(report)
            ray.shutdown()
            kill_cluster_under(temp_dir)
            shutil.rmtree(temp_dir, ignore_errors=True)
            if attempt < ATTEMPTS:
                warnings.warn(f"the shared Ray cluster did not start; trying once more.\n{report}", stacklevel=2)
    raise RayStartupError("the shared Ray cluster did not start:\n" + "\n\n".join(reports))
