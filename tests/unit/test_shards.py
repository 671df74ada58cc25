"""The train split's shards (one per training worker, data/shards.py) and the batch order each worker trains in
(trainer_kit/shard_sampler.py): disjoint, covering, sizes within one, a function of (data, workers) only; the order a
function of (seed, epoch) only."""

from __future__ import annotations

from pathlib import Path

import pytest

from medgpt_ray.data import shards
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.trainer_kit.shard_sampler import ShardBatchSampler, epoch_order

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample"
SOURCES = [str(SAMPLE / "sft_sharegpt.jsonl"), str(SAMPLE / "formats" / "sft_sharegpt_tools.jsonl")]


@pytest.mark.parametrize("n", [0, 1, 7, 64, 1001])
@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_shard_ranges_are_disjoint_cover_and_differ_by_at_most_one(n, workers):
    ranges = [shards.shard_range(n, workers, k) for k in range(workers)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # contiguous, no overlap
    sizes = [stop - start for start, stop in ranges]
    assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError):
        shards.shard_range(n, workers, workers)


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """The sample SFT data prepared with 3-row row groups (many of them), files given in both orders."""
    out = tmp_path_factory.mktemp("shards")
    mp = pytest.MonkeyPatch()
    mp.setattr(shards, "ROW_GROUP", 3)
    try:
        a = prepare_kind("sft", SOURCES, out / "a", 0.1)
        b = prepare_kind("sft", SOURCES[::-1], out / "b", 0.1)
    finally:
        mp.undo()
    return a, b


def test_shards_read_only_their_rows_and_together_are_the_split(split):
    a, _ = split
    whole = shards.read_records(a.train_file)
    assert len(whole) == a.train_records == shards.num_rows(a.train_file) > 20
    assert shards.pq.ParquetFile(a.train_file).metadata.num_row_groups > 5
    for workers in (1, 2, 3, 4):
        parts = [shards.read_shard(a.train_file, workers, k) for k in range(workers)]
        assert [r for records, _ in parts for r in records] == whole
        for records, (start, stop) in parts:
            assert records == whole[start:stop]
    assert shards.read_records(a.train_file, 5, 5) == []


def test_same_data_gives_the_same_shards_whatever_the_file_order(split):
    a, b = split
    for workers in (2, 3):
        for k in range(workers):
            assert shards.read_shard(a.train_file, workers, k) == shards.read_shard(b.train_file, workers, k)
    assert shards.read_records(a.eval_file) == shards.read_records(b.eval_file)
    ka = shards.read_table(a.train_file).column("key").to_pylist()
    assert ka == sorted(ka) and len(set(ka)) == len(ka)  # hash order, and the shards are disjoint by key


def test_batch_order_depends_only_on_seed_and_epoch_and_pads_to_every_ranks_count():
    s = ShardBatchSampler(n=10, length=11, batch_size=4, seed=7)
    first = list(s)
    assert len(first) == len(s) == 3 and [len(b) for b in first] == [4, 4, 3]
    flat = [i for b in first for i in b]
    assert sorted(flat[:10]) == list(range(10)) and flat[10] == flat[0]  # padded with the epoch's first example
    assert list(ShardBatchSampler(n=10, length=11, batch_size=4, seed=7)) == first  # a new process, same batches
    s.set_epoch(1)
    second = [i for b in s for i in b]
    assert second != flat and sorted(second[:10]) == list(range(10))
    s.set_epoch(0)
    assert list(s) == first
    assert epoch_order(10, 10, 8, 0) != epoch_order(10, 10, 7, 0)
    assert epoch_order(2, 5, 1, 0) == epoch_order(2, 2, 1, 0) * 2 + epoch_order(2, 1, 1, 0)
    dropped = ShardBatchSampler(n=10, length=11, batch_size=4, seed=7, drop_last=True)
    assert len(dropped) == 2 and list(dropped) == first[:2]
