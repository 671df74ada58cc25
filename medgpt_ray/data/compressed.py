"""Compressed source files: `x.jsonl.gz`, `x.csv.bz2`, `x.txt.xz` are read as the file they hold, decompressed as a
stream (never whole on disk, never split across read tasks: a compressed stream has no byte offsets to cut at).
Parquet compresses inside itself and is never wrapped."""

from __future__ import annotations

import bz2
import gzip
import lzma
from collections.abc import Callable
from pathlib import Path
from typing import IO

from medgpt_ray.data.readers import SUFFIXES, DataFileError

OPENERS: dict[str, Callable[[Path], IO[bytes]]] = {
    ".gz": lambda p: gzip.open(p, "rb"), ".bz2": lambda p: bz2.open(p, "rb"), ".xz": lambda p: lzma.open(p, "rb")}
COMPRESSIBLE = (".jsonl", ".json", ".csv", ".txt")
# What a stream that is not what its suffix says raises while it is read.
STREAM_ERRORS = (gzip.BadGzipFile, EOFError, lzma.LZMAError, OSError)


def compression(path: Path) -> str | None:
    """The compression suffix (".gz", ".bz2", ".xz") of a compressed data file, else None."""
    suffix = path.suffix.lower()
    return suffix if suffix in OPENERS else None


def data_suffix(path: Path) -> str:
    """The data format's suffix, under a compression suffix: ".jsonl" for `a.jsonl.gz`, "" for `a.gz`."""
    if compression(path) is None:
        return path.suffix.lower()
    return Path(path.stem).suffix.lower()


def readable_suffix(path: Path) -> bool:
    """A format we read, plain or (a text format) compressed."""
    return data_suffix(path) in (COMPRESSIBLE if compression(path) else SUFFIXES)


def open_bytes(path: Path) -> IO[bytes]:
    """The file's bytes as a binary stream: decompressed where its suffix says it is compressed."""
    kind = compression(path)
    return OPENERS[kind](path) if kind else path.open("rb")


def read_all(path: Path) -> bytes:
    with open_bytes(path) as fh:
        return fh.read()


def stream_error(path: Path, error: BaseException) -> DataFileError:
    return DataFileError(f"{path}: not a readable {compression(path)} stream ({type(error).__name__}: {error}); "
                         f"the records up to here were read, the rest of the file is not")


SUPPORTED = f"{', '.join(SUFFIXES)}; {', '.join(COMPRESSIBLE)} also as {'/'.join(OPENERS)}"
