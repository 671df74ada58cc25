"""Turn the config's data files into the canonical train/held-out split as Parquet (data/shards.py: the file
layout, and the shard each training worker reads), streaming: the driver's memory does not grow with the corpus
(bench/prepare_rss.py).

The split is deterministic (by a hash of each record, not by position or a
seeded shuffle), so the same data always gives the same held-out set even when
files are reordered. Records that cannot be used go to an owner-only quarantine
file with file, line and reason; nothing is dropped silently.

Every canonical record is PII-redacted (data/ops/record.py's redact_record, the cleaner's own) before it is
written anywhere, scratch file included, unless the caller passes no PII types (data.redact_pii: false). The
quarantine holds no record text for rows that parsed (file, line and a reason that never quotes a value); only
lines that did not parse are kept raw, in that 0600 file.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from medgpt_ray.config import DataConfig
from medgpt_ray.data.files import Quarantined, iter_canonical
from medgpt_ray.data.input_paths import expand_paths
from medgpt_ray.data.kinds import DataFileError, source_kinds
from medgpt_ray.data.ops.pii import ORDER as PII_TYPES
from medgpt_ray.data.ops.record import redact_record
from medgpt_ray.data.private import open_private, private_dir
from medgpt_ray.data.shards import SplitWriter


@dataclass
class PreparedData:
    kind: str
    train_file: str  # Parquet, hash order; worker k of N reads its row range (data/shards.py)
    eval_file: str  # Parquet, hash order; read whole
    source_records: int
    train_records: int
    eval_records: int
    quarantined: int
    quarantine_file: str | None
    # PII items replaced by placeholders, per type redacted (0 included); empty when redaction was off.
    redactions: dict[str, int] = field(default_factory=dict)
    # Entries of a directory given as data that were not read, with why ([path, reason]; input_paths.py).
    skipped_files: list[list[str]] = field(default_factory=list)


def redaction_text(counts: dict[str, int]) -> str:
    """`, 3 PII redactions (2 id_card, 1 phone)`, or "" when there were none: counts only, never a value."""
    total = sum(counts.values())
    if not total:
        return ""
    by_type = ", ".join(f"{n} {t}" for t, n in counts.items() if n)
    return f", {total} PII redaction{'s' if total != 1 else ''} ({by_type})"


def prepared_line(d: PreparedData) -> str:
    """The pipeline's one line per prepared kind."""
    q = f", {d.quarantined} quarantined -> {d.quarantine_file}" if d.quarantined else ""
    line = (f"data {d.kind}: {d.source_records} source records -> {d.train_records} train / {d.eval_records} "
            f"held out{redaction_text(d.redactions)}{q}")
    if d.skipped_files:  # a directory's files that were not read are said, never dropped without a word
        named = ", ".join(f"{Path(f).name} ({why})" for f, why in d.skipped_files[:3])
        more = f" and {len(d.skipped_files) - 3} more" if len(d.skipped_files) > 3 else ""
        line += f"; {len(d.skipped_files)} file(s) in its directories not read: {named}{more}"
    return line


def not_redacted_line(sources: list[str]) -> str:
    """What the pipeline says once when data.redact_pii is false (the opt-out is logged, never silent)."""
    keys = ", ".join(f"data.{k}" for k in sources)
    return f"data.redact_pii is false: records from {keys} are trained as given, not PII-redacted"


def _record_key(record: dict) -> str:
    """What decides a record's split: its hash, or for the halves of a preference pair read as unpaired data their
    pair's id, so both land in the same split (next to each other)."""
    if "pair" in record:
        return hashlib.sha256(f"pair:{record['pair']}".encode()).hexdigest()
    return hashlib.sha256(json.dumps(record, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def kind_paths(data: DataConfig, kind: str) -> list[str]:
    """The files read as `kind` data: data.<kind>'s, then those of the kinds also read as it (data/kinds.py
    ALSO_READ_AS: a kto stage's unpaired examples include data.preference's pairs)."""
    return [p for k in source_kinds(kind) for p in data.paths(k)]


def split_positions(hashes: np.ndarray, eval_fraction: float, max_records: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) record positions, each in hash order. Held-out = the records whose hash is among the
    lowest `eval_fraction` of them (at least one when there are two or more); equal hashes keep reading order.
    With `max_records`, the first max_records train and max(1, max_records // 4) held-out ones."""
    order = np.argsort(hashes, kind="stable")
    n_eval = max(1, round(len(order) * eval_fraction)) if len(order) >= 2 else 0
    held_out, train = order[:n_eval], order[n_eval:]
    if max_records is not None:
        train, held_out = train[:max_records], held_out[: max(1, max_records // 4)]
    return train, held_out


def _write_split(src: Path, offsets: array, hashes: np.ndarray, positions: np.ndarray, dest: Path) -> None:
    """Write the records whose scratch lines start at `offsets[positions]`, in that order, to the Parquet file
    `dest`: created owner-only (it holds record text), written in bounded row groups, renamed into place."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    with src.open("rb") as fh, open_private(tmp, "wb") as out:
        writer = SplitWriter(out)
        for pos in positions.tolist():
            fh.seek(offsets[pos])
            writer.add(int(hashes[pos]), fh.readline().decode("utf-8").rstrip("\n"))
        writer.close()
    os.replace(tmp, dest)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sources_fingerprint(paths: list[str]) -> str:
    """Of the bytes of exactly the files that will be read (expand_paths' rules: every supported suffix,
    hidden files skipped); a missing path is a DataFileError naming it."""
    h = hashlib.sha256()
    for f in expand_paths(paths) if paths else []:
        h.update(f.name.encode())
        h.update(file_sha256(f).encode())
    return h.hexdigest()


def data_fingerprint(paths: list[str], data: DataConfig) -> str:
    """Of the sources' bytes and of every option of `data` that prepare_kind is given: the split and the PII
    types redacted (none: data.redact_pii false), so toggling redaction re-prepares and retrains."""
    options = [data.eval_fraction, data.max_records, sorted(data.pii_types()), sources_fingerprint(paths)]
    return hashlib.sha256(json.dumps(options).encode()).hexdigest()


def _nothing_usable(kind: str, paths: list[str], source: int, quarantine_file: str | None) -> DataFileError:
    """Why a kind's files gave no record to train on: they hold none, or every one was quarantined (where, why)."""
    if not source:
        return DataFileError(f"data.{kind}: {', '.join(map(str, paths))}: no records (empty); give files with at "
                             f"least one {kind} record")
    return DataFileError(f"data.{kind}: none of the {source} source records could be used: all quarantined, each "
                         f"with its reason in {quarantine_file}")


def prepare_kind(kind: str, paths: list[str], out_dir: Path, eval_fraction: float,
                 max_records: int | None = None, pii_types: Collection[str] = PII_TYPES) -> PreparedData:
    """Read, convert and split `paths` as `kind` data, streaming: the driver holds 16 bytes per record (a hash
    prefix and a file offset), never the records. Pass 1 PII-redacts (`pii_types`; empty: records as given)
    and writes every canonical record once to a private scratch file and every unusable row to the quarantine
    file; pass 2 writes the scratch records into the train and held-out Parquet files in hash order. The split
    hashes the redacted record, the text that is trained."""
    if not paths:
        keys = " or ".join(f"data.{k}" for k in source_kinds(kind))
        raise ValueError(f"{keys}: no files configured, but an enabled stage needs {kind} data")
    skipped: list[tuple[Path, str]] = []
    expand_paths(paths, skipped)  # what iter_canonical will read; what it will not, for the line and the report
    private_dir(out_dir)  # record text: 0700, and its files 0600
    qpath, scratch = out_dir / f"quarantine-{kind}.jsonl", out_dir / f".{kind}.canonical.jsonl.tmp"
    hashes, offsets = array("Q"), array("Q")
    source = quarantined = 0
    redactions = dict.fromkeys(pii_types, 0)
    qfh = None
    try:
        with open_private(scratch, "wb") as fh:
            for item in iter_canonical(paths, kind):  # type: ignore[arg-type]
                source += 1
                if isinstance(item, Quarantined):
                    qfh = qfh or open_private(qpath)
                    qfh.write(json.dumps(asdict(item), ensure_ascii=False) + "\n")
                    quarantined += 1
                    continue
                for record in item:
                    if pii_types:
                        record, found = redact_record(record, kind, pii_types)
                        for t, n in found.items():
                            redactions[t] += n
                    offsets.append(fh.tell())
                    fh.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
                    hashes.append(int(_record_key(record)[:16], 16))
        if qfh is not None:
            qfh.close()
        quarantine_file = str(qpath) if quarantined else None
        if not hashes:
            raise _nothing_usable(kind, paths, source, quarantine_file)
        keys = np.frombuffer(hashes, dtype=np.uint64)
        train, held_out = split_positions(keys, eval_fraction, max_records)
        train_file, eval_file = out_dir / f"{kind}.train.parquet", out_dir / f"{kind}.eval.parquet"
        _write_split(scratch, offsets, keys, train, train_file)
        _write_split(scratch, offsets, keys, held_out, eval_file)
    finally:
        if qfh is not None and not qfh.closed:
            qfh.close()
        scratch.unlink(missing_ok=True)
    return PreparedData(kind, str(train_file), str(eval_file), source, len(train), len(held_out), quarantined,
                        quarantine_file, redactions, [[str(f), why] for f, why in skipped])
