"""Whose directory `--out` is: the cleaner replaces its own outputs there, and nothing else.

A directory the cleaner wrote carries MARKER. One that is not empty and has no marker is someone else's: it is
refused unless the user says --overwrite (and then only data/, quarantine/ and _work/ in it are replaced). An
input inside the output directory, or an output directory inside an input directory, is always refused: the
first would be deleted before it is read, the second read back as input by the next run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from medgpt_ray.data.kinds import DataFileError

MARKER = ".medgpt-clean.json"
OWN_SUBDIRS = ("data", "quarantine", "_work")


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def claim_output_dir(out: str | Path, inputs: Sequence[str | Path], overwrite: bool = False) -> Path:
    """Check `out` against the rules above, create it (0700 when new) and mark it ours. Returns it resolved."""
    out = Path(out).resolve()
    for given in inputs:
        src = Path(given).resolve()
        if _inside(src, out):
            raise DataFileError(f"{given}: the input is inside the output directory {out}, which the cleaner "
                                "replaces; choose another --out")
        if src.is_dir() and _inside(out, src):
            raise DataFileError(f"--out {out} is inside the input directory {given}: its outputs would be read as "
                                "input by the next run; choose an --out outside it")
    if out.exists() and not out.is_dir():
        raise DataFileError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file() and not overwrite:
        raise DataFileError(f"--out {out}: not empty and not written by medgpt-ray clean (no {MARKER}); choose a new "
                            f"or empty directory, or pass --overwrite to replace its {', '.join(OWN_SUBDIRS)} "
                            "(nothing else in it is touched)")
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    (out / MARKER).write_text(json.dumps({"written_by": "medgpt-ray clean", "replaces": list(OWN_SUBDIRS)}) + "\n",
                              encoding="utf-8")
    return out
