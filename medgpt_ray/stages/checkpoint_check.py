"""Is an HF checkpoint readable? Cheap structural checks that catch a truncated file (a worker or a node died while
saving, a full disk) without loading a tensor; and setting unreadable checkpoints aside so the one before is
resumed from. Pure: no Ray, no torch.

A truncation shows in every format the Trainer and DeepSpeed write: JSON stops parsing, a safetensors file is
shorter than its header's largest data offset, and a torch zip file (`torch.save`: optimizer.pt, rng_state.pth,
training_args.bin, DeepSpeed's global_step*/ files) loses its central directory, which sits at the end.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

from medgpt_ray.stages.outputs import latest_checkpoint

# Not "checkpoint-...": HF's rotation (save_total_limit) and our latest_checkpoint only see `checkpoint-*`.
CORRUPT_PREFIX = "corrupt-"
TORCH_ZIP_SUFFIXES = (".pt", ".pth", ".bin")


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"truncated, {size:,} bytes, no header"
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            return f"truncated, {size:,} of at least {8 + n:,} bytes (header cut)"
        try:
            header = json.loads(fh.read(n))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError):
            return "header unreadable"
    expected = 8 + n + end
    if size < expected:
        return f"truncated, {size:,} of {expected:,} bytes"
    return None


def _torch_zip_problem(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path):
            return None
    except (zipfile.BadZipFile, OSError):
        return f"not a complete zip file (truncated?), {path.stat().st_size:,} bytes"


def _json_problem(path: Path) -> str | None:
    try:
        json.loads(path.read_bytes())
        return None
    except ValueError:
        return f"JSON does not parse (truncated?), {path.stat().st_size:,} bytes"


def checkpoint_problem(ckpt: Path) -> str | None:
    """None when every file of `ckpt` looks complete; else the first problem, naming the file
    ("adapter_model.safetensors: truncated, 1,234 of 5,678 bytes")."""
    state = ckpt / "trainer_state.json"
    if not state.is_file():
        return "trainer_state.json: missing"
    for path in sorted(p for p in ckpt.rglob("*") if p.is_file()):
        if path.suffix == ".safetensors":
            problem = _safetensors_problem(path)
        elif path.suffix in TORCH_ZIP_SUFFIXES:
            problem = _torch_zip_problem(path)
        elif path.suffix == ".json":
            problem = _json_problem(path)
        else:
            continue
        if problem:
            return f"{path.relative_to(ckpt)}: {problem}"
    return None


def _aside_name(ckpt: Path) -> Path:
    """corrupt-checkpoint-N, or corrupt-checkpoint-N.2, ... when an earlier attempt already set one aside."""
    target = ckpt.with_name(CORRUPT_PREFIX + ckpt.name)
    n = 2
    while target.exists():
        target = ckpt.with_name(f"{CORRUPT_PREFIX}{ckpt.name}.{n}")
        n += 1
    return target


def set_aside_unreadable(ckpt_dir: Path) -> tuple[list[tuple[str, str, str]], str | None]:
    """Check the checkpoints newest first; rename each unreadable one to corrupt-checkpoint-N (kept for a look,
    nothing deleted) until a readable one is found. Returns ([(name, problem, new name), ...], the newest readable
    checkpoint or None): `latest_checkpoint` then picks that one, as the workers do."""
    aside: list[tuple[str, str, str]] = []
    while (newest := latest_checkpoint(ckpt_dir)) is not None:
        problem = checkpoint_problem(Path(newest))
        if problem is None:
            break
        target = _aside_name(Path(newest))
        Path(newest).rename(target)
        aside.append((Path(newest).name, problem, target.name))
    return aside, newest
