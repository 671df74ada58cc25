"""What the cleaner reads: its inputs expanded to files (what was skipped said), each file's kind detected when
asked (--kind auto), and every file cut into byte-range chunks sized for the cluster. Pure: data/clean.py hands
the chunks to Ray Data."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from medgpt_ray.data.chunks import CHUNK_BYTES, SourceChunk, plan_chunks
from medgpt_ray.data.file_rows import iter_rows
from medgpt_ray.data.input_paths import describe_skipped, expand_paths
from medgpt_ray.data.readers import KIND_FORMATS, DataFileError, RecordError, detect_format


def chunk_bytes(chunk: SourceChunk) -> int:
    """Bytes a chunk covers (the progress line's ETA): its byte range, or the whole file."""
    return chunk.end - chunk.start if chunk.end >= 0 else os.path.getsize(chunk.path)


def detect_kind(path: Path) -> tuple[str, str]:
    """(format, kind) of a file from its first parseable row; --kind auto says what it found."""
    for _, row in iter_rows(path):
        if isinstance(row, RecordError):
            continue
        try:
            fmt = detect_format(row)
        except RecordError:
            continue
        kind = next(k for k, fmts in KIND_FORMATS.items() if fmt in fmts)
        if kind == "exam":
            raise DataFileError(f"{path}: multiple-choice exam questions ({fmt}) are not cleaned; list the file "
                                f"under data.exam (the eval stage reads it as it is)")
        return fmt, kind
    raise DataFileError(f"{path}: no row of a known source format; pass --kind explicitly")


MIN_CHUNK_BYTES = 256 << 10


def plan_inputs(inputs: list[str], kind: str, echo: Callable[[str], None], cpus: int = 1,
                chunks_per_cpu: int = 4) -> list[SourceChunk]:
    """Chunks of every input. Chunks are at most CHUNK_BYTES, and smaller when the inputs are small for the
    cluster (a 50 MB corpus on 16 CPUs: ~0.8 MB chunks, so every core gets work)."""
    skipped: list[tuple[Path, str]] = []
    paths = expand_paths(inputs, skipped)
    for line in describe_skipped(skipped):
        echo(f"[clean] {line}")
    total = sum(p.stat().st_size for p in paths)
    size = min(CHUNK_BYTES, max(MIN_CHUNK_BYTES, total // (chunks_per_cpu * max(1, cpus))))
    chunks: list[SourceChunk] = []
    for file_no, path in enumerate(paths):
        if kind == "auto":
            fmt, file_kind = detect_kind(path)
            echo(f"[clean] {path}: detected {fmt} -> {file_kind}")
        else:
            file_kind = kind
        chunks.extend(plan_chunks(path, file_kind, file_no, size))
    return chunks
