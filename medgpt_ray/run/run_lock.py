"""One run at a time per run directory: an exclusive lock on `runs/<name>/run.lock`, with the holder's PID, host and
start time written in it.

The lock is the kernel's (`fcntl.flock`), so a run that dies for any reason (Ctrl-C, kill -9, a lost node's NFS
client) leaves it free: the file alone never blocks a run. A record left in a free lock file is a run that ended
without releasing it (killed): the next run takes the lock over and says whose it was. The file is emptied on
release, never deleted: deleting a lock file lets two runs each lock a file of the same name. Python opens the
descriptor non-inheritable, so the Ray processes this driver starts do not keep the lock after it exits.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

LOCK_FILE = "run.lock"


class RunDirBusy(RuntimeError):
    """Another live run holds the run directory's lock; the message names its PID and host."""


def _holder(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    try:
        record = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError):
        record = {}
    return record if isinstance(record, dict) else {}


def _alive_here(record: dict[str, Any]) -> bool | None:
    """Whether the record's PID is a live process on this host; None when it is another host's (unknowable)."""
    if record.get("host") != socket.gethostname() or not isinstance(record.get("pid"), int):
        return None
    try:
        os.kill(record["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _who(record: dict[str, Any]) -> str:
    return f"PID {record.get('pid', '?')} on host {record.get('host', '?')}"


def _busy(run_dir: Path, record: dict[str, Any]) -> RunDirBusy:
    since = f", started {record['started']}" if record.get("started") else ""
    return RunDirBusy(f"run directory {run_dir} is in use by another run ({_who(record)}{since}); wait for it to "
                      "end, stop it, or give this run another name (--set name=...)")


def _stale_line(run_dir: Path, record: dict[str, Any]) -> str:
    gone = "that process is gone" if _alive_here(record) is False else "it no longer holds the lock"
    return (f"medgpt-ray: took over the stale lock of {run_dir} left by {_who(record)} ({gone}); that run was cut "
            "short: finished stages and checkpoints are kept")


@contextmanager
def run_dir_lock(run_dir: Path, echo: Callable[[str], None] = print) -> Iterator[Path]:
    """Hold `run_dir`'s lock for the block (the directory is made first: OSError if it cannot be); RunDirBusy when
    another live run holds it. A stale lock is taken over with a line through `echo`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(run_dir, _holder(fd)) from None
        left = _holder(fd)
        if left:
            echo(_stale_line(run_dir, left))
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode("utf-8"), 0)
        os.fsync(fd)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)  # released cleanly: nothing for the next run to call stale
    finally:
        os.close(fd)  # closing the descriptor releases the flock
