"""Files and directories that hold record text (corpus rows, quarantined lines, canonical splits): created
owner-only from the start, never chmod'ed after, and never reusing an existing file's wider mode."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def private_dir(path: str | Path) -> Path:
    """Create `path` (and missing parents) 0700; an existing directory is narrowed to 0700 too, since what we
    are about to write into it is private whatever it held before."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    if path.stat().st_mode & 0o077:
        path.chmod(PRIVATE_DIR)
    return path


def open_private(path: str | Path, mode: str = "w") -> IO[Any]:
    """A new 0600 file at `path` for writing. An existing file is unlinked first: O_TRUNC would keep its old
    mode (a 0644 file would stay readable by everyone with raw lines in it)."""
    path = Path(path)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))
