"""Turn the config's data files into canonical train/eval JSONL that every stage worker reads.

The split is deterministic (by a hash of each record, not by position or a
seeded shuffle), so the same data always gives the same held-out set even when
files are reordered. Records that cannot be used go to an owner-only quarantine
file with file, line and reason; nothing is dropped silently.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from medgpt_ray.data.files import expand_paths, load_canonical


@dataclass
class PreparedData:
    kind: str
    train_file: str
    eval_file: str
    source_records: int
    train_records: int
    eval_records: int
    quarantined: int
    quarantine_file: str | None


def _record_key(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def split_records(records: list[dict], eval_fraction: float) -> tuple[list[dict], list[dict]]:
    """Held-out set = records whose hash falls in the lowest `eval_fraction` of the hash space;
    at least one record is held out when there are two or more."""
    keyed = sorted(((_record_key(r), r) for r in records), key=lambda kr: kr[0])
    n_eval = max(1, round(len(keyed) * eval_fraction)) if len(keyed) >= 2 else 0
    eval_recs = [r for _, r in keyed[:n_eval]]
    train_recs = [r for _, r in keyed[n_eval:]]
    return train_recs, eval_recs


def _write_jsonl(path: Path, records: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def data_fingerprint(paths: list[str], eval_fraction: float, max_records: int | None) -> str:
    """Of the bytes of exactly the files that will be read (expand_paths' rules: every supported suffix,
    hidden files skipped); a missing path is a DataFileError naming it."""
    h = hashlib.sha256(json.dumps([eval_fraction, max_records]).encode())
    for f in expand_paths(paths) if paths else []:
        h.update(f.name.encode())
        h.update(file_sha256(f).encode())
    return h.hexdigest()


def prepare_kind(kind: str, paths: list[str], out_dir: Path, eval_fraction: float,
                 max_records: int | None = None) -> PreparedData:
    if not paths:
        raise ValueError(f"data.{kind}: no files configured, but an enabled stage needs {kind} data")
    out_dir.mkdir(parents=True, exist_ok=True)
    loaded = load_canonical(paths, kind)  # type: ignore[arg-type]
    quarantine_file = None
    if loaded.quarantined:
        qpath = out_dir / f"quarantine-{kind}.jsonl"
        # Owner-only: quarantined lines may hold raw, unredacted text.
        fd = os.open(qpath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for q in loaded.quarantined:
                fh.write(json.dumps(asdict(q), ensure_ascii=False) + "\n")
        quarantine_file = str(qpath)
    if not loaded.records:
        raise ValueError(f"data.{kind}: none of the {loaded.source_count} source records could be used "
                         f"(see {quarantine_file})")
    train, held_out = split_records(loaded.records, eval_fraction)
    if max_records is not None:
        train, held_out = train[:max_records], held_out[: max(1, max_records // 4)]
    train_file, eval_file = out_dir / f"{kind}.train.jsonl", out_dir / f"{kind}.eval.jsonl"
    _write_jsonl(train_file, train)
    _write_jsonl(eval_file, held_out)
    return PreparedData(kind, str(train_file), str(eval_file), loaded.source_count, len(train), len(held_out),
                        len(loaded.quarantined), quarantine_file)
