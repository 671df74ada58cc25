"""Dedup features: exact hashes and MinHash-LSH band keys of canonical records (pure, no Ray).

What identifies a record for dedup (`dedup_text`): all its text fields joined with "\\n", each turn prefixed by
its role (tool_call and tool turns included: a call's JSON and a tool's result are part of the text), the
preference answers by "chosen"/"rejected" and a prompt record's reference answer (when not None) by "answer",
so the same texts under other roles differ; a record's `tools` schemas are not part of it;
then NFKC, lowercase, and every character that is not a letter or a digit (whitespace, CJK and ASCII
punctuation, symbols) removed. Records that differ only in spacing, punctuation, full/half width or case
have the same dedup text, hence the same `exact_hash`.

Near duplicates (`minhash_signature`, `band_hashes`): the dedup text is cut into character n-grams
(`DedupConfig.ngram`; a text shorter than n is one shingle, itself); each shingle is hashed once to 64 bits
with a fixed, seedless function of its code points computed by numpy for a whole batch at once (a polynomial
with fixed odd 64-bit multipliers, then MurmurHash3's fmix64: as good as blake2b-64 for this and over 10x faster
than hashing shingle strings one by one) and reduced mod the Mersenne prime p = 2^61 - 1; each of the
`num_perm` universal hashes h(x) = (a*x + b) mod p, with a in [1, p) and b in [0, p) drawn from
`np.random.default_rng(seed)`, is computed exactly in uint64 (products split into 32-bit halves, folded mod p),
vectorised over shingles x permutations (each distinct shingle of a batch once), and the signature keeps the
minimum per permutation. LSH: the signature is cut into `bands` bands of
num_perm/bands rows; a band's key is a 64-bit hash of its rows, seeded by the band index and the record kind
(`band_hashes`). Two records sharing any band key are candidates; `jaccard_estimate` (the fraction of equal signature
entries) checks them against `DedupConfig.threshold`.

Determinism: nothing here uses Python's salted `hash()` or set iteration order for anything but a min, so
the outputs are the same in every process and on every machine (numpy's `default_rng` stream is fixed for
the pinned numpy version).

`dedup_features` adds `exact_hash`, `dedup_keys` and `minhash` columns to a table of `id` + `record`
(canonical record JSON); grouping by key and choosing the survivor is `data/clean.py`'s job.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from functools import lru_cache

import numpy as np
import pyarrow as pa

from medgpt_ray.config import DedupConfig

KINDS = ("pretrain", "sft", "preference", "prompt")

MERSENNE_61 = (1 << 61) - 1
_P = np.uint64(MERSENNE_61)
_MASK29 = np.uint64((1 << 29) - 1)
_MASK32 = np.uint64((1 << 32) - 1)
_U3, _U29, _U32, _U61 = np.uint64(3), np.uint64(29), np.uint64(32), np.uint64(61)
# Shingles per vectorised chunk: keeps the (shingles x num_perm) uint64 temporaries cache-sized (256 KiB at 128).
_CHUNK_SHINGLES = 256
# Bound on (distinct shingles x num_perm) uint64 values held for one group of records (32 MiB).
_GROUP_ELEMENTS = 1 << 22
# Code points hashed into shingles at once (a few arrays of 8 bytes each); longer texts are cut into pieces.
_GROUP_CHARS = 1 << 20
_PIECE_CHARS = 1 << 16

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


# ---------------------------------------------------------------------------------------------------------------
# MinHash
# ---------------------------------------------------------------------------------------------------------------


def shingles(text: str, n: int) -> set[str]:
    """Character n-grams of `text`; a text shorter than n (the empty text included) gives {text}."""
    if n < 1:
        raise ValueError(f"shingle size must be >= 1, got {n}")
    if len(text) <= n:
        return {text}
    return {text[i:i + n] for i in range(len(text) - n + 1)}


def _splitmix64(i: int) -> int:
    z = (i * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


@lru_cache(maxsize=8)
def _shingle_keys(n: int) -> np.ndarray:
    """n + 1 fixed odd 64-bit multipliers: one per code point position of a shingle, one for its length."""
    keys = np.array([_splitmix64(j + 1) | 1 for j in range(n + 1)], dtype=np.uint64)
    keys.setflags(write=False)
    return keys


def _fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, in place (uint64 arithmetic wraps mod 2^64)."""
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xC4CEB9FE1A85EC53)
    x ^= x >> np.uint64(33)
    return x


def _shingle_hashes(texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hashes of every character n-gram of every text, reduced mod p, vectorised over the whole batch.

    A shingle s of length L (n, or len(text) < n for a short text) hashes to
    fmix64(sum_j codepoint(s[j]) * K[j] + L * K[n]) mod 2^64, with fixed odd multipliers K: a function of the
    shingle's characters alone (same value in every record, process and machine). Returns (hashes, bounds):
    text i's shingle hashes are hashes[bounds[i]:bounds[i + 1]], one per position (repeats included).
    """
    if n < 1:
        raise ValueError(f"shingle size must be >= 1, got {n}")
    keys = _shingle_keys(n)
    lens = np.fromiter((len(t) for t in texts), dtype=np.intp, count=len(texts))
    starts = np.zeros(len(texts) + 1, dtype=np.intp)
    np.cumsum(lens, out=starts[1:])
    cps = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype="<u4").astype(np.uint64)
    windows = max(len(cps) - n + 1, 0)
    acc = np.full(windows, n, dtype=np.uint64)
    acc *= keys[n]  # the length term of a full n-gram
    for j in range(n):
        acc += cps[j:j + windows] * keys[j]
    counts = np.maximum(lens - n + 1, 1)
    bounds = np.zeros(len(texts) + 1, dtype=np.intp)
    np.cumsum(counts, out=bounds[1:])
    # text i's k-th shingle (output row bounds[i] + k) is the window starting at code point starts[i] + k
    window = np.arange(bounds[-1]) + np.repeat(starts[:-1] - bounds[:-1], counts)
    full = lens >= n
    if full.all():
        hashes = acc[window]
    else:
        hashes = np.empty(bounds[-1], dtype=np.uint64)
        rows = np.repeat(full, counts)
        hashes[rows] = acc[window[rows]]
        for i in np.flatnonzero(~full):  # a text shorter than n is one shingle: itself
            terms = np.append(cps[starts[i]:starts[i + 1]], np.uint64(lens[i]))
            terms *= keys[np.r_[0:lens[i], n]]
            hashes[bounds[i]] = terms.sum(dtype=np.uint64)
    hashes = _fmix64(hashes)
    hashes = (hashes & _P) + (hashes >> _U61)  # 2^61 = 1 mod p; now <= p + 7
    hashes = (hashes & _P) + (hashes >> _U61)  # now <= p
    hashes[hashes == _P] = 0
    return hashes, bounds


@lru_cache(maxsize=16)
def _permutations(seed: int, num_perm: int) -> tuple[np.ndarray, ...]:
    """(8*a_hi, a_lo, b) as (1, num_perm) uint64 rows, a = a_hi*2^32 + a_lo in [1, p), b in [0, p)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, MERSENNE_61, size=num_perm, dtype=np.uint64)
    b = rng.integers(0, MERSENNE_61, size=num_perm, dtype=np.uint64)
    rows = ((a >> _U32) << _U3, a & _MASK32, b)  # 8*a_hi < 2^32
    for r in rows:
        r.setflags(write=False)
    return tuple(r.reshape(1, -1) for r in rows)


class _Workspace:
    """Reusable (rows, num_perm) uint64 buffers for `_universal_hashes` (no allocation per chunk)."""

    def __init__(self, rows: int, num_perm: int):
        self.rows = rows
        self.buffers = [np.empty((rows, num_perm), dtype=np.uint64) for _ in range(3)]

    def take(self, n: int) -> list[np.ndarray]:
        return [b[:n] for b in self.buffers]


def _universal_hashes(x: np.ndarray, seed: int, num_perm: int, ws: _Workspace | None = None,
                      out: np.ndarray | None = None) -> np.ndarray:
    """(a*x + b) mod p for every x (row) and permutation (column), exactly, in uint64: shape (len(x), num_perm).

    x must be < p. The result goes to `out` when given, else to `ws`'s first buffer (valid until its next use).
    """
    a_hi8, a_lo, b = _permutations(seed, num_perm)
    ws = ws if ws is not None and ws.rows >= len(x) else _Workspace(len(x), num_perm)
    r, mid, t = ws.take(len(x))
    if out is not None:
        r = out
    x = x.reshape(-1, 1)
    x_hi, x_lo = x >> _U32, x & _MASK32  # x_hi < 2^29
    # a*x = a_hi*x_hi*2^64 + mid*2^32 + a_lo*x_lo, mid = a_hi*x_lo + a_lo*x_hi < 2^62. Mod p: 2^64 = 8, 2^61 = 1.
    np.multiply(x_hi, a_hi8, out=r)  # a_hi*x_hi*8 < 2^61
    np.multiply(x_hi, a_lo, out=mid)
    np.multiply(x_lo, a_hi8 >> _U3, out=t)
    mid += t
    np.right_shift(mid, _U29, out=t)  # mid*2^32 = (mid >> 29)*2^61 + (mid & mask29)*2^32
    r += t
    mid &= _MASK29
    mid <<= _U32
    r += mid
    np.multiply(x_lo, a_lo, out=mid)  # lo < 2^64 = (lo >> 61)*2^61 + (lo & p)
    np.right_shift(mid, _U61, out=t)
    r += t
    mid &= _P
    r += mid
    r += b  # r < 2^61 + (2^33 + 2^61) + (8 + 2^61) + 2^61 < 2^64
    for _ in range(2):  # fold: r <= p + 7, then r <= p
        np.right_shift(r, _U61, out=t)
        r &= _P
        r += t
    np.subtract(r, _P, out=r, where=r >= _P)
    return r


def _minhash_rows(hashes: np.ndarray, bounds: np.ndarray, cfg: DedupConfig, ws: _Workspace, out: np.ndarray) -> None:
    """out[i] = per-permutation min of the universal hashes of hashes[bounds[i]:bounds[i + 1]].

    Records are taken in groups of bounded total shingles; within a group each distinct shingle hash goes through
    the permutations once (records share many n-grams), in cache-sized chunks, then every record takes its min.
    """
    num_perm = cfg.num_perm
    group_limit = max(_CHUNK_SHINGLES, _GROUP_ELEMENTS // num_perm)
    start, count = 0, len(bounds) - 1
    while start < count:
        # the longest run of records from `start` whose shingles fit the group (at least one record)
        end = max(int(np.searchsorted(bounds, bounds[start] + group_limit, side="right")) - 1, start + 1)
        x = hashes[bounds[start]:bounds[end]]
        if end == start + 1:  # one record (possibly a long one): running min over chunks of its shingles
            sig = np.full(num_perm, np.iinfo(np.uint64).max, dtype=np.uint64)
            for i in range(0, len(x), _CHUNK_SHINGLES):
                np.minimum(sig, _universal_hashes(x[i:i + _CHUNK_SHINGLES], cfg.seed, num_perm, ws).min(axis=0),
                           out=sig)
            out[start] = sig
        else:
            uniq, inverse = np.unique(x, return_inverse=True)
            values = np.empty((len(uniq), num_perm), dtype=np.uint64)
            for i in range(0, len(uniq), _CHUNK_SHINGLES):
                chunk = slice(i, i + _CHUNK_SHINGLES)
                _universal_hashes(uniq[chunk], cfg.seed, num_perm, ws, out=values[chunk])
            local = bounds[start:end + 1] - bounds[start]
            for i in range(end - start):  # a per-record gather + min beats minimum.reduceat(axis=0) by ~10x
                values.take(inverse[local[i]:local[i + 1]], axis=0).min(axis=0, out=out[start + i])
        start = end


def _signatures(texts: list[str], cfg: DedupConfig) -> np.ndarray:
    """MinHash signatures of many texts: uint64 (len(texts), num_perm), in memory bounded whatever the input.

    Texts longer than _PIECE_CHARS are cut into pieces overlapping by ngram - 1 characters (their shingles are
    exactly the text's) and a text's signature is the min over its pieces'; pieces are hashed in groups of at
    most _GROUP_CHARS code points.
    """
    n, num_perm = cfg.ngram, cfg.num_perm
    pieces: list[str] = []
    first: list[int] = []  # index of each text's first piece
    step = _PIECE_CHARS - n + 1
    for t in texts:
        first.append(len(pieces))
        if len(t) <= _PIECE_CHARS:
            pieces.append(t)
        else:
            pieces.extend(t[a:a + _PIECE_CHARS] for a in range(0, len(t) - n + 1, step))
    sigs = np.empty((len(pieces), num_perm), dtype=np.uint64)
    ws = _Workspace(_CHUNK_SHINGLES, num_perm)
    ends = np.cumsum([len(p) for p in pieces], dtype=np.intp)
    start = 0
    while start < len(pieces):
        offset = ends[start - 1] if start else 0
        end = max(int(np.searchsorted(ends, offset + _GROUP_CHARS, side="right")), start + 1)
        hashes, bounds = _shingle_hashes(pieces[start:end], n)
        _minhash_rows(hashes, bounds, cfg, ws, out=sigs[start:end])
        start = end
    if len(pieces) == len(texts):
        return sigs
    return np.minimum.reduceat(sigs, np.array(first, dtype=np.intp), axis=0)


def minhash_signature(text: str, cfg: DedupConfig) -> np.ndarray:
    """uint64[num_perm] MinHash of the text's character `cfg.ngram`-grams (see the module docstring)."""
    return _signatures([text], cfg)[0]


def _check_bands(num_perm: int, bands: int) -> int:
    if bands < 1 or num_perm % bands:
        raise ValueError(f"num_perm={num_perm} is not divisible by bands={bands}: each LSH band needs "
                         f"the same number of signature rows")
    return num_perm // bands


EXACT_BIT = np.uint64(1 << 63)  # set on exact keys, clear on LSH band keys: a key says which it is
_BAND_MIX = np.uint64(0x9E3779B97F4A7C15)


def kind_salt(kind: str) -> np.uint64:
    """A fixed 64-bit salt per record kind: keys of different kinds never meet (a pretraining paragraph is
    never a duplicate of a conversation)."""
    if kind not in KINDS:
        raise ValueError(f"unknown record kind {kind!r}; expected one of {', '.join(KINDS)}")
    return np.uint64(_splitmix64(KINDS.index(kind) + 101))


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
            h = _fmix64(h ^ cube[:, :, r] * _BAND_MIX)
    return h & ~EXACT_BIT


def exact_keys(hex_hashes: list[str], kind: str) -> np.ndarray:
    """Exact-duplicate keys, uint64 (n,): the first 64 bits of each `exact_hash`, mixed with the kind, top bit
    set. Two different texts share a key with probability ~2^-63 per pair (1M records: ~1e-7 for the corpus)."""
    first = np.array([int(h[:16], 16) for h in hex_hashes], dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _fmix64(first ^ kind_salt(kind)) | EXACT_BIT


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
        sigs = _signatures(texts, cfg).astype("<u8", copy=False)
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
