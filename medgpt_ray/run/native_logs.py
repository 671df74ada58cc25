"""Ray's native (C++) log lines on the driver's stderr go to the command's log file, not the terminal.

The driver's core worker writes its own ERROR/WARNING lines straight to file descriptor 2, past Python's logging
(`core_worker.cc: ... max_restarts > 0 ...` when Ray Data starts its actor pool; the raylet's and the core worker's
lines while the local cluster goes down at exit). Routing them means owning fd 2: it becomes a pipe, and a thread
copies each line to the terminal, or to the log file when it has the shape of Ray's native log lines
(`[2026-12-04 20:42:11,668 E 22124 22124] file.cc:123: ...`) or names a Ray process (`(raylet) ...`).
At exit Ray is shut down while the pipe is still read (Ray's own exit hook would run after ours), then fd 2 is
given back.

Only for a command run as a process: a caller that has replaced sys.stderr (pytest) keeps its own.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import sys
import threading
from pathlib import Path

NATIVE_LINE = re.compile(rb"^\s*(\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [DIWEF] \d+ \d+\] |\((raylet|gcs_server|"
                         rb"core_worker|dashboard_agent|runtime_env_agent)[^)]*\) )")


class NativeStderrRouter:
    def __init__(self, log_file: Path):
        self.log_file = Path(log_file)
        self.terminal = -1
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        sys.stderr.flush()
        self.terminal = os.dup(2)
        read_end, write_end = os.pipe()
        # fd 2 becomes the pipe's write end, inheritable (dup2's default) as the original was: the raylet and GCS
        # that ray.init starts write their lines into it too, and are shut down before the pipe is closed.
        os.dup2(write_end, 2)
        os.close(write_end)
        self.thread = threading.Thread(target=self._pump, args=(read_end,), name="native-stderr", daemon=True)
        self.thread.start()

    def _pump(self, read_end: int) -> None:
        with os.fdopen(read_end, "rb") as src, self.log_file.open("ab") as log:
            for line in iter(src.readline, b""):
                if NATIVE_LINE.match(line):
                    log.write(line)
                    log.flush()
                else:
                    try:
                        os.write(self.terminal, line)
                    except OSError:  # the terminal is gone: keep draining, or every stderr write would block
                        pass

    def stop(self) -> None:
        """fd 2 back to the terminal: the pipe's last write end closes, the thread reads to its end and stops."""
        if self.thread is None:
            return
        sys.stderr.flush()
        os.dup2(self.terminal, 2)
        self.thread.join(timeout=5)
        os.close(self.terminal)
        self.thread = None


_ROUTER: NativeStderrRouter | None = None


def _second_ctrl_c_stops(signum: int, frame: object) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the next one raises KeyboardInterrupt


def _shut_down_ray_then_stop() -> None:
    try:
        if "ray" in sys.modules:
            import ray

            # The command has ended: a Ctrl-C now would only leave a traceback from inside Ray's shutdown (a few
            # seconds for a local cluster) in place of the command's last line. The first is ignored; a second
            # stops waiting for the shutdown (Ray's own exit hook still runs).
            signal.signal(signal.SIGINT, _second_ctrl_c_stops)
            try:
                ray.shutdown()  # its exit-time lines still reach the log file
            except KeyboardInterrupt:
                pass
    finally:
        if _ROUTER is not None:
            _ROUTER.stop()


def route_native_stderr(log_file: Path) -> bool:
    """Route Ray's native log lines on fd 2 to `log_file` until this process exits; True when routing (once per
    process; not when sys.stderr is not the process's own, as under pytest)."""
    global _ROUTER
    if _ROUTER is not None or sys.stderr is not sys.__stderr__:
        return _ROUTER is not None
    _ROUTER = NativeStderrRouter(log_file)
    _ROUTER.start()
    atexit.register(_shut_down_ray_then_stop)  # after Ray's own atexit hook was registered: so it runs first
    return True
