"""Dedup features: exact hashes and MinHash-LSH band keys of canonical records (pure, no Ray).

What identifies a record for dedup (`dedup_text`): all its text fields joined with "\\n", each turn prefixed by
its role (tool_call and tool turns included: a call's JSON and a tool's result are part of the text), the
preference answers by "chosen"/"rejected", a prompt record's reference answer (when not None) by "answer" and an
unpaired record's completion by "completion" and its label (the same text as desirable and as undesirable is two
records), so the same texts under other roles differ; a record's `tools` schemas are not part of it;
then NFKC, lowercase, and every character that is not a letter or a digit (whitespace, CJK and ASCII
punctuation, symbols) removed. Records that differ only in spacing, punctuation, full/half width or case
have the same dedup text, hence the same `exact_hash`.

Near duplicates: the dedup text's MinHash signature (`ops.minhash`, character `DedupConfig.ngram`-grams,
`num_perm` permutations) is cut into `bands` bands of num_perm/bands rows; a band's key is a 64-bit hash of its
rows, seeded by the band index and the record kind (`band_hashes`). Two records sharing any band key are
candidates; `jaccard_estimate` (the fraction of equal signature entries) checks them against
`DedupConfig.threshold`.

Determinism: nothing here uses Python's salted `hash()` or set iteration order for anything but a min, so
the outputs are the same in every process and on every machine (numpy's `default_rng` stream is fixed for
the pinned numpy version).

`dedup_features` adds `exact_hash`, `dedup_keys` and `minhash` columns to a table of `id` + `record`
(canonical record JSON); grouping by key and choosing the survivor is `data/dedup_marks.py`'s job.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata

import numpy as np
import pyarrow as pa

from medgpt_ray.config import DedupConfig
from medgpt_ray.data.kinds import KINDS
from medgpt_ray.data.ops.minhash import fmix64, signatures

_NOT_WORD = re.compile(r"[\W_]+")


# ---------------------------------------------------------------------------------------------------------------
# dedup text and exact hash
# ---------------------------------------------------------------------------------------------------------------


def _field(record: dict, name: str, kind: str):
    try:
        return record[name]
    except (KeyError, TypeError):
        raise ValueError(f"{kind} record has no {name!r} field") from None


def _turns(record: dict, kind: str) -> list[str]:
    conversations = _field(record, "conversations", kind)
    if not isinstance(conversations, list):
        raise ValueError(f"{kind} record: 'conversations' is not a list")
    parts = []
    for i, turn in enumerate(conversations):
        if not isinstance(turn, dict) or not isinstance(turn.get("content"), str):
            raise ValueError(f"{kind} record: turn {i} has no string 'content'")
        parts.append(f"{turn.get('role', '')}\n{turn['content']}")
    return parts


def _joined(record: dict, kind: str) -> str:
    if kind == "pretrain":
        text = _field(record, "text", kind)
        if not isinstance(text, str):
            raise ValueError("pretrain record: 'text' is not a string")
        return text
    if kind == "sft":
        return "\n".join(_turns(record, kind))
    if kind == "preference":
        parts = _turns(record, kind)
        for name in ("chosen", "rejected"):
            value = _field(record, name, kind)
            if not isinstance(value, str):
                raise ValueError(f"preference record: {name!r} is not a string")
            parts.append(f"{name}\n{value}")
        return "\n".join(parts)
    if kind == "prompt":
        parts = _turns(record, kind)
        answer = record.get("answer")  # None or missing: no reference answer
        if answer is not None:
            if not isinstance(answer, str):
                raise ValueError("prompt record: 'answer' is not a string or null")
            parts.append(f"answer\n{answer}")
        return "\n".join(parts)
    if kind == "unpaired":
        completion, label = _field(record, "completion", kind), _field(record, "label", kind)
        if not isinstance(completion, str) or not isinstance(label, bool):
            raise ValueError("unpaired record: 'completion' is not a string or 'label' not a boolean")
        return "\n".join([*_turns(record, kind), f"completion {label}\n{completion}"])
    raise ValueError(f"unknown record kind {kind!r}; expected one of {', '.join(KINDS)}")


def normalize_for_dedup(text: str) -> str:
    """NFKC, lowercase, and drop everything that is not a letter or digit (whitespace, punctuation, symbols)."""
    return _NOT_WORD.sub("", unicodedata.normalize("NFKC", text).lower())


def dedup_text(record: dict, kind: str) -> str:
    """The text that identifies a canonical record of `kind` for dedup (see the module docstring)."""
    return normalize_for_dedup(_joined(record, kind))


def exact_hash(text: str) -> str:
    """Hex blake2b-128 of the UTF-8 bytes."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def _check_bands(num_perm: int, bands: int) -> int:
    if bands < 1 or num_perm % bands:
        raise ValueError(f"num_perm={num_perm} is not divisible by bands={bands}: each LSH band needs "
                         f"the same number of signature rows")
    return num_perm // bands


EXACT_BIT = np.uint64(1 << 63)  # set on exact keys, clear on LSH band keys: a key says which it is
_BAND_MIX = np.uint64(0x9E3779B97F4A7C15)


def kind_salt(kind: str) -> np.uint64:
    """A fixed 64-bit salt per record kind, from its name: keys of different kinds never meet (a pretraining
    paragraph is never a duplicate of a conversation)."""
    if kind not in KINDS:
        raise ValueError(f"unknown record kind {kind!r}; expected one of {', '.join(KINDS)}")
    return np.uint64(int.from_bytes(hashlib.blake2b(kind.encode(), digest_size=8).digest(), "little"))


def band_hashes(signatures: np.ndarray, bands: int, kind: str) -> np.ndarray:
    """LSH keys, uint64 (n, bands): band i of a signature hashed with fmix64 chaining over its rows, seeded by
    the band index and the kind, top bit clear. Vectorised over all records and bands at once."""
    sigs = np.ascontiguousarray(signatures, dtype=np.uint64)
    if sigs.ndim == 1:
        sigs = sigs.reshape(1, -1)
    rows = _check_bands(sigs.shape[1], bands)
    cube = sigs.reshape(len(sigs), bands, rows)
    with np.errstate(over="ignore"):
        h = np.arange(1, bands + 1, dtype=np.uint64) * _BAND_MIX ^ kind_salt(kind)
        h = np.repeat(h.reshape(1, bands), len(sigs), axis=0)
        for r in range(rows):
            h = fmix64(h ^ cube[:, :, r] * _BAND_MIX)
    return h & ~EXACT_BIT


def exact_keys(hex_hashes: list[str], kind: str) -> np.ndarray:
    """Exact-duplicate keys, uint64 (n,): the first 64 bits of each `exact_hash`, mixed with the kind, top bit
    set. Two different texts share a key with probability ~2^-63 per pair (1M records: ~1e-7 for the corpus)."""
    first = np.array([int(h[:16], 16) for h in hex_hashes], dtype=np.uint64)
    with np.errstate(over="ignore"):
        return fmix64(first ^ kind_salt(kind)) | EXACT_BIT


def jaccard_estimate(a: np.ndarray, b: np.ndarray) -> float:
    """Estimated Jaccard similarity of two MinHash signatures: the fraction of equal entries."""
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"signatures must be 1-D and of the same non-zero length, got {a.shape} and {b.shape}")
    return float(np.count_nonzero(a == b)) / len(a)


# ---------------------------------------------------------------------------------------------------------------
# table op
# ---------------------------------------------------------------------------------------------------------------

FEATURE_COLUMNS = ("exact_hash", "dedup_keys", "minhash")


def dedup_features(table: pa.Table, kind: str, cfg: DedupConfig) -> pa.Table:
    """Add `exact_hash` (string), `dedup_keys` (list<uint64>) and `minhash` (binary) to a table of `id` + `record`.

    `record` holds canonical record JSON strings; every other column is kept (existing feature columns are
    replaced). `exact_hash` is always computed (it is cheap). `dedup_keys` are the keys the cleaner groups
    records by: the exact key (`exact_keys`) when `cfg.exact`, then one LSH key per band (`band_hashes`) when
    `cfg.near`. With `cfg.near` False `minhash` is empty bytes; otherwise the signature as little-endian uint64
    bytes.
    Errors name the row's id, never its text.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown record kind {kind!r}; expected one of {', '.join(KINDS)}")
    for name in ("id", "record"):
        if name not in table.column_names:
            raise ValueError(f"dedup_features needs an {name!r} column; got {table.column_names}")
    if cfg.near:
        _check_bands(cfg.num_perm, cfg.bands)
    ids = table.column("id").to_pylist()
    texts = []
    for rid, raw in zip(ids, table.column("record").to_pylist(), strict=True):
        try:
            if raw is None:
                raise ValueError("record is null")
            texts.append(dedup_text(json.loads(raw), kind))
        except (ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError; its message quotes no text
            reason = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            raise ValueError(f"dedup_features: row id={rid!r}: {reason}") from None
    hashes = [exact_hash(t) for t in texts]
    key_cols = [exact_keys(hashes, kind).reshape(-1, 1)] if cfg.exact else []
    if cfg.near:
        sigs = signatures(texts, cfg).astype("<u8", copy=False)
        key_cols.append(band_hashes(sigs, cfg.bands, kind))
        minhash = pa.FixedSizeBinaryArray.from_buffers(pa.binary(sigs.shape[1] * 8), len(sigs),
                                                       [None, pa.py_buffer(sigs.tobytes())]).cast(pa.binary())
    else:
        minhash = pa.array([b""] * len(texts), pa.binary())
    keys = np.hstack(key_cols) if key_cols else np.zeros((len(texts), 0), np.uint64)
    dedup_keys = pa.ListArray.from_arrays(pa.array(np.arange(0, keys.size + 1, max(keys.shape[1], 1))
                                                   if keys.shape[1] else np.zeros(len(texts) + 1, np.int32),
                                                   pa.int32()), pa.array(keys.ravel(), pa.uint64()))
    out = table.drop_columns([c for c in FEATURE_COLUMNS if c in table.column_names])
    out = out.append_column("exact_hash", pa.array(hashes, type=pa.string()))
    out = out.append_column("dedup_keys", dedup_keys)
    return out.append_column("minhash", minhash)
