"""The shared cluster's start-up helpers: a failed start is explained from its own logs, and only its own
processes are killed (another cluster on this machine is left alone)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from tests.ray_startup import kill_cluster_under, log_tails, pids_started_under, ray_temp_root


def test_only_processes_naming_the_temp_dir_are_killed():
    ours, theirs = ray_temp_root(), ray_temp_root()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    procs = [subprocess.Popen([*sleeper, str(d / "session_latest")]) for d in (ours, theirs)]
    try:
        # Popen returns once exec has begun; the new command line shows in /proc a moment later (the kernel sets it
        # after it closes the parent's exec-error pipe): a loaded box read it empty once.
        deadline = time.monotonic() + 10
        while pids_started_under(ours) != [procs[0].pid] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pids_started_under(ours) == [procs[0].pid]
        kill_cluster_under(ours)
        deadline = time.monotonic() + 10
        while procs[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert procs[0].poll() is not None, "the process started under our temp dir is still running"
        assert procs[1].poll() is None, "a process of another temp dir was killed"
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(ours), shutil.rmtree(theirs)


def test_the_report_quotes_the_newest_sessions_raylet_log(tmp_path):
    old, new = tmp_path / "session_1" / "logs", tmp_path / "session_2" / "logs"
    for logs, text in ((old, "old session"), (new, "\n".join(f"line {i}" for i in range(100)))):
        logs.mkdir(parents=True)
        (logs / "raylet.err").write_text(text)
    os.utime(old, (1_000_000, 1_000_000))  # the older session, whatever the file system's clock resolution
    report = log_tails(tmp_path)
    assert "line 75" in report and "line 99" in report and "line 74" not in report
    assert "old session" not in report
    assert report.startswith("load average:")
    assert "no Ray session logs" in log_tails(tmp_path / "empty")
