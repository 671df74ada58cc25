"""MinHash signatures of texts, vectorised with numpy (pure, no Ray): the engine under ops.dedup's near-duplicate
keys.

The text is cut into character n-grams (`DedupConfig.ngram`; a text shorter than n is one shingle, itself); each
shingle is hashed once to 64 bits with a fixed, seedless function of its code points computed by numpy for a
whole batch at once (a polynomial with fixed odd 64-bit multipliers, then MurmurHash3's fmix64: as good as
blake2b-64 for this and over 10x faster than hashing shingle strings one by one) and reduced mod the Mersenne
prime p = 2^61 - 1; each of the `num_perm` universal hashes h(x) = (a*x + b) mod p, with a in [1, p) and b in
[0, p) drawn from `np.random.default_rng(seed)`, is computed exactly in uint64 (products split into 32-bit
halves, folded mod p), vectorised over shingles x permutations (each distinct shingle of a batch once), and the
signature keeps the minimum per permutation. Nothing here uses Python's salted `hash()`: the same signature in
every process and on every machine.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from medgpt_ray.config import DedupConfig

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


def splitmix64(i: int) -> int:
    z = (i * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


@lru_cache(maxsize=8)
def _shingle_keys(n: int) -> np.ndarray:
    """n + 1 fixed odd 64-bit multipliers: one per code point position of a shingle, one for its length."""
    keys = np.array([splitmix64(j + 1) | 1 for j in range(n + 1)], dtype=np.uint64)
    keys.setflags(write=False)
    return keys


def fmix64(x: np.ndarray) -> np.ndarray:
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
    hashes = fmix64(hashes)
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


def signatures(texts: list[str], cfg: DedupConfig) -> np.ndarray:
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
    return signatures([text], cfg)[0]
