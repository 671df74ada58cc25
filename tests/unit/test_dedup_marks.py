"""The dedup decision's pure steps (medgpt_ray.data.dedup_marks): key partitions, candidate pairs, marks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from medgpt_ray.data.convert import id_from_number, id_numbers, record_id
from medgpt_ray.data.dedup_marks import MAX_PAIRWISE, candidate_pairs, decide_marks, explode_keys, partition_keys
from medgpt_ray.data.ops.dedup import EXACT_BIT


def test_candidate_pairs_of_a_block_and_the_marks_they_give():
    """The vectorised grouping: an exact group points every member at its first, an LSH bucket pairs each
    member with at most MAX_PAIRWISE earlier ones, a pair seen in two bands counts once, and the marks keep
    exact over near and verify near pairs on their signatures."""
    exact_key, band_a, band_b, hot = int(EXACT_BIT) | 7, 11, 12, 13
    rows = [(exact_key, 30), (exact_key, 10), (exact_key, 20),  # exact group, out of order
            (band_a, 10), (band_a, 40), (band_b, 10), (band_b, 40),  # the same near pair in two bands
            *((hot, 1000 + i) for i in range(MAX_PAIRWISE + 8)), (99, 5)]  # a hot bucket, a lone key
    order = np.random.default_rng(0).permutation(len(rows))
    block = pa.table({"key": pa.array([rows[i][0] for i in order], pa.uint64()),
                      "rid": pa.array([rows[i][1] for i in order], pa.int64())})
    parts = partition_keys(block, 3)
    assert sum(p.num_rows for p in parts) == block.num_rows
    assert all(not set(a["key"].to_pylist()) & set(b["key"].to_pylist()) for a in parts for b in parts if a is not b)
    pairs = pa.concat_tables([candidate_pairs(p) for p in parts])
    got = set(zip(pairs["rid"].to_pylist(), pairs["cand"].to_pylist(), pairs["exact"].to_pylist(), strict=True))
    assert {(20, 10, True), (30, 10, True)} <= got and (30, 20, True) not in got
    assert sum(1 for p in got if p[:2] == (40, 10)) == 1
    hot_pairs = [p for p in got if p[0] >= 1000]
    assert max(sum(1 for p in hot_pairs if p[0] == r) for r in range(1000, 1000 + MAX_PAIRWISE + 8)) == MAX_PAIRWISE
    assert all(p[1] < p[0] for p in got) and not any(5 in p[:2] for p in got)

    ids = pa.array([record_id(0, 3, 0), record_id(2, 14, 1)])
    assert [id_from_number(n) for n in id_numbers(ids).to_pylist()] == ids.to_pylist()
    sig = np.arange(128, dtype=np.uint64)
    far = sig + np.uint64(1000)
    sigs = pa.table({"rid": pa.array([10, 40, 1000, 1001], pa.int64()),
                     "minhash": [sig.tobytes(), sig.tobytes(), sig.tobytes(), far.tobytes()]})
    marks = decide_marks(pa.table({"rid": [40, 30, 20, 1001], "cand": [10, 10, 10, 1000],
                                   "exact": [False, True, True, False]}), sigs, 0.8)
    assert marks.to_pylist() == [
        {"id": id_from_number(20), "dup_of": id_from_number(10), "how": "exact"},
        {"id": id_from_number(30), "dup_of": id_from_number(10), "how": "exact"},
        {"id": id_from_number(40), "dup_of": id_from_number(10), "how": "near"}]


def test_explode_keys_skips_dropped_rows_and_numbers_ids():
    batch = pa.table({"id": [record_id(0, 1, 0), record_id(0, 2, 0), record_id(1, 7, 2)],
                      "dropped_by": [None, "quality", None],
                      "dedup_keys": pa.array([[5, 6], [7], [5]], pa.list_(pa.uint64()))})
    keyed = explode_keys(batch)
    assert list(zip(keyed["key"].to_pylist(), keyed["rid"].to_pylist(), strict=True)) == [
        (5, 1000), (6, 1000), (5, 10**13 + 7002)]
