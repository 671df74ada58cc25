"""When this process started, on the wall clock: a stage worker's first start-up mark (run/wave.py STARTUP_MARKS).
Standard library only, so a no-op Ray Train worker (bench/startup_split.py) reads it without the package's imports."""

from __future__ import annotations

import os
from pathlib import Path


def process_started_wall() -> float | None:
    """When this process started, on the wall clock (Linux's /proc, to the kernel's clock tick; the boot time it adds
    is whole seconds), or None where there is no /proc."""
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in clock ticks
    except (OSError, ValueError, IndexError, StopIteration):
        return None
