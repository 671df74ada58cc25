"""Which files to read: the paths a user gives, directories expanded to their data files, and what was left out
(and why) for the user to see. A path that cannot be read is an error here, before any record is."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from medgpt_ray.data.compressed import SUPPORTED, readable_suffix
from medgpt_ray.data.readers import DataFileError


def _unreadable(path: Path) -> DataFileError | None:
    """Why a path we are told to read cannot be: not a regular file (a FIFO would block open() forever, a device
    never end) or no read permission. None when it can."""
    if not path.is_file():
        what = "a FIFO" if path.is_fifo() else "a socket" if path.is_socket() else "not a regular file"
        return DataFileError(f"{path}: {what}; give regular data files")
    if not os.access(path, os.R_OK):
        return DataFileError(f"{path}: permission denied (cannot read it)")
    return None


def _skip_reason(entry: Path) -> str | None:
    """Why a directory entry is not read: hidden, an unsupported suffix, not a regular file. None: read it."""
    if entry.name.startswith("."):
        return "hidden"
    if entry.is_dir():
        return "directory"
    if not entry.is_file():
        return "not a regular file"
    if not readable_suffix(entry):
        return f"unsupported suffix {''.join(entry.suffixes[-2:]) or '(none)'}"
    return None


def expand_paths(paths: Sequence[str | Path], skipped: list[tuple[Path, str]] | None = None) -> list[Path]:
    """Files to read, in order: directories expand to their data files (recursive, sorted). Entries of a
    directory that are not read (hidden, unsupported suffix, FIFO and the like) are appended to `skipped` with
    the reason, for the caller to list; a path named directly must be a readable regular file, and an
    unreadable file in a directory is an error too (its records would be missing without a word)."""
    out: list[Path] = []
    seen: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise DataFileError(f"{p}: no such file or directory")
        if p.is_dir():
            found = []
            for entry in sorted(p.rglob("*")):
                if any(part.startswith(".") for part in entry.relative_to(p).parts[:-1]):
                    continue  # inside a hidden directory: the directory itself is listed once
                reason = _skip_reason(entry)
                if reason is None:
                    found.append(entry)
                elif reason != "directory" and skipped is not None:
                    skipped.append((entry, reason))
            if not found:
                raise DataFileError(f"{p}: directory holds no data files ({SUPPORTED})")
        else:
            found = [p]
        for f in found:
            if (error := _unreadable(f)) is not None:
                raise error
            key = f.resolve()
            if key not in seen:  # a file named directly and through its folder is read once
                seen.add(key)
                out.append(f)
    return out


def describe_skipped(skipped: list[tuple[Path, str]], limit: int = 10) -> list[str]:
    """Lines for the user: how many entries were not read and why, naming up to `limit` of them."""
    if not skipped:
        return []
    lines = [f"{len(skipped)} director{'y entry' if len(skipped) == 1 else 'y entries'} not read:"]
    lines += [f"  {path}: {why}" for path, why in skipped[:limit]]
    if len(skipped) > limit:
        lines.append(f"  ... and {len(skipped) - limit} more")
    return lines

