"""The dedup decision over the cleaner's stage-1 rows, as pure functions over pyarrow tables (no Ray; data/clean.py
runs them as Ray tasks).

    explode_keys      one 16-byte (key, rid) row per dedup key of every live record (ops.dedup.dedup_features)
    partition_keys    split those rows by key into P tables: the map side of a shuffle (equal keys, one partition)
    candidate_pairs   one partition's (later, earlier, exact) candidate pairs, numpy over the whole partition
    decide_marks      exact pairs stand, near pairs are checked on their MinHash signatures; each duplicate
                      is marked with the earliest record it repeats
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from medgpt_ray.data.convert import id_from_number, id_numbers
from medgpt_ray.data.ops.dedup import EXACT_BIT

MAX_PAIRWISE = 32  # a hot LSH bucket pairs each member with at most this many earlier ones
KEYED_SCHEMA = pa.schema([("key", pa.uint64()), ("rid", pa.int64())])
PAIR_SCHEMA = pa.schema([("rid", pa.int64()), ("cand", pa.int64()), ("exact", pa.bool_())])
MARK_SCHEMA = pa.schema([("id", pa.string()), ("dup_of", pa.string()), ("how", pa.string())])
KEY_COLUMNS = ["id", "dropped_by", "dedup_keys"]


def explode_keys(batch: pa.Table) -> pa.Table:
    """One 16-byte (key, rid) row per dedup key (exact key, LSH bands; see ops.dedup) of every record no operator
    dropped; rid is the record id as a number (convert.id_numbers). Signatures stay out of the shuffle (1 KiB
    each). Arrow kernels only: no Python per row."""
    live = batch.filter(pc.is_null(batch["dropped_by"]))
    keys = live["dedup_keys"].combine_chunks()
    owner = pc.list_parent_indices(keys)
    return pa.Table.from_arrays([pc.list_flatten(keys), id_numbers(live["id"]).take(owner)], schema=KEYED_SCHEMA)


def partition_keys(keyed: pa.Table, parts: int) -> list[pa.Table]:
    """The map side of the key shuffle: `parts` tables, rows with equal keys always in the same one. The keys are
    already uniform 64-bit hashes, so key % parts balances them."""
    if parts == 1:
        return [keyed]
    part = (keyed["key"].to_numpy() % np.uint64(parts)).astype(np.intp)
    order = np.argsort(part, kind="stable")
    bounds = np.searchsorted(part[order], np.arange(parts + 1))
    table = keyed.take(order)
    return [table.slice(bounds[p], bounds[p + 1] - bounds[p]) for p in range(parts)]


def candidate_pairs(block: pa.Table) -> pa.Table:
    """Candidate (later rid, earlier rid, exact) pairs of a table that holds whole key groups (one partition of
    the key shuffle). Within a group, by rid: an exact group points every member at its first; an LSH bucket
    pairs each member with up to MAX_PAIRWISE earlier ones. Numpy over the whole table: no Python per group.
    A pair found in several bands is kept once."""
    if block.num_rows < 2:
        return PAIR_SCHEMA.empty_table()
    key = block["key"].to_numpy()
    rid = block["rid"].to_numpy()
    order = np.lexsort((rid, key))
    key, rid = key[order], rid[order]
    new_group = np.empty(len(key), bool)
    new_group[0] = True
    np.not_equal(key[1:], key[:-1], out=new_group[1:])
    start = np.maximum.accumulate(np.where(new_group, np.arange(len(key)), 0))  # each row's group start
    rank = np.arange(len(key)) - start  # position within the group
    exact = (key & EXACT_BIT) != 0
    count = np.where(exact, np.minimum(rank, 1), np.minimum(rank, MAX_PAIRWISE))
    later = np.repeat(np.arange(len(key)), count)
    first_slot = np.repeat(np.cumsum(count) - count, count)
    earlier = np.repeat(start, count) + (np.arange(len(later)) - first_slot)
    pairs = np.unique(np.stack([rid[later], rid[earlier], exact[later].astype(np.int64)], axis=1), axis=0)
    return pa.Table.from_arrays([pa.array(pairs[:, 0]), pa.array(pairs[:, 1]), pa.array(pairs[:, 2].astype(bool))],
                                schema=PAIR_SCHEMA)


def near_candidates(pairs: pa.Table) -> pa.Array:
    """The rids whose signatures decide_marks needs: both sides of every near pair."""
    near = pairs.filter(pc.invert(pairs["exact"]))
    return pc.unique(pa.chunked_array([*near["rid"].chunks, *near["cand"].chunks], pa.int64()))


def signatures_of(batch: pa.Table, wanted: pa.Array) -> pa.Table:
    """(rid, minhash) of the rows of a stage-1 table (id, minhash) whose rid is in `wanted`."""
    rid = id_numbers(batch["id"])
    keep = pc.is_in(rid, value_set=wanted)
    return pa.table({"rid": rid.filter(keep), "minhash": batch["minhash"].filter(keep)})


def decide_marks(pairs: pa.Table, sigs: pa.Table, threshold: float) -> pa.Table:
    """(id, dup_of, how): the earliest record each duplicate repeats, exact|near. Exact pairs stand; near pairs
    must reach the Jaccard threshold on the full signatures (`sigs`: rid, minhash). Of several, the smallest
    (dup_of, how) wins: deterministic. Vectorised (numpy over signature rows, Arrow sort); Python only to
    spell the marked ids."""
    near = pc.invert(pairs["exact"])
    if pairs.num_rows and pc.any(near).as_py():
        cand = pairs.filter(near)
        sig_ids = sigs["rid"].combine_chunks()
        mat = np.frombuffer(b"".join(sigs["minhash"].to_pylist()), dtype=np.uint64).reshape(len(sig_ids), -1)
        a = pc.index_in(cand["rid"], value_set=sig_ids).to_numpy()
        b = pc.index_in(cand["cand"], value_set=sig_ids).to_numpy()
        similar = np.empty(len(a), dtype=bool)
        for s in range(0, len(a), 8192):
            similar[s:s + 8192] = (mat[a[s:s + 8192]] == mat[b[s:s + 8192]]).mean(axis=1) >= threshold
        pairs = pa.concat_tables([pairs.filter(pairs["exact"]), cand.filter(pa.array(similar))])
    if pairs.num_rows == 0:
        return MARK_SCHEMA.empty_table()
    # "exact" sorts before "near": exact=True first at equal (rid, cand)
    pairs = pairs.sort_by([("rid", "ascending"), ("cand", "ascending"), ("exact", "descending")])
    best = pairs.take(group_starts(pairs["rid"]))
    return pa.table({"id": [id_from_number(n) for n in best["rid"].to_pylist()],
                     "dup_of": [id_from_number(n) for n in best["cand"].to_pylist()],
                     "how": pc.if_else(best["exact"], "exact", "near")}, schema=MARK_SCHEMA)


def group_starts(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Start positions of the runs of equal values in an array."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    n = len(values)
    if n == 0:
        return np.zeros(0, np.int64)
    change = pc.not_equal(values.slice(1), values.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    return np.flatnonzero(np.concatenate(([True], change)))


