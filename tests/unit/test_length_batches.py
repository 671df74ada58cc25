"""Length-grouped batches (trainer_kit/shard_sampler.py): steps of similar lengths pad less than random ones, hold the
same examples in the same order whatever the micro-batch x accumulation split (the OOM back-off's invariant), and
depend only on (seed, epoch); the lengths come from the tokenized columns TRL's trainers hold. (The real RM/DPO
loaders with bucket padding: tests/stages/test_length_loaders.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from medgpt_ray.trainer_kit.shard_sampler import WINDOW_STEPS, ShardBatchSampler, epoch_order, example_lengths

BUCKET = 128


def preference_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Pairs as in the issue's benchmark: a prompt of 30-200 tokens and answers of 200-1,500, cut at seq_len 1024."""
    rng = np.random.default_rng(seed)
    return np.minimum(rng.integers(30, 200, n) + rng.integers(200, 1500, n), 1024)


def steps_of(batches: list[list[int]], step: int) -> list[list[int]]:
    """The optimizer steps the Trainer makes of these micro-batches: `step` examples each, in order."""
    flat = [i for b in batches for i in b]
    return [flat[k : k + step] for k in range(0, len(flat), step)]


def padded_slots(batches: list[list[int]], lengths: np.ndarray, bucket: int = 1) -> int:
    """Token slots the micro-batches take when each is padded to its longest row, rounded up to `bucket`."""
    return sum(len(b) * -(-int(lengths[b].max()) // bucket) * bucket for b in batches)


def test_grouped_steps_pad_less_than_random_ones():
    n, micro, accum = 2000, 4, 4
    lengths = preference_lengths(n)
    plain = list(ShardBatchSampler(n, n, micro, seed=3))
    grouped = list(ShardBatchSampler(n, n, micro, seed=3, lengths=lengths, step=micro * accum))
    real = int(lengths.sum())
    assert sorted(i for b in grouped for i in b) == list(range(n))  # every example once, as before
    fill_plain = real / padded_slots(plain, lengths)
    fill_grouped = real / padded_slots(grouped, lengths)
    fill_bucketed = real / padded_slots(grouped, lengths, BUCKET)
    assert fill_plain < 0.85 and fill_grouped > 0.97, (fill_plain, fill_grouped)
    assert fill_bucketed > 0.88  # rounding up to 128 costs half a bucket a row at most on average
    # Accumulation 1 (one micro-batch a step): grouping whole steps still helps, sorting within a step could not.
    one = list(ShardBatchSampler(n, n, 16, seed=3, lengths=lengths, step=16))
    assert real / padded_slots(one, lengths) > 0.97


@pytest.mark.parametrize("n,length", [(200, 200), (203, 211), (37, 40), (1000, 1000)])
def test_a_back_off_trains_the_same_examples_per_step_in_the_same_order(n, length):
    """Micro-batch 8 x 4, 4 x 8, 2 x 16, 1 x 32: the same 32-example steps, example for example, with the epoch's
    partial step last; every rank's `length` examples (padded with the epoch's first) are all trained."""
    lengths = preference_lengths(n, seed=n)
    runs = {micro: list(ShardBatchSampler(n, length, micro, seed=11, lengths=lengths, step=32))
            for micro in (8, 4, 2, 1)}
    steps = {micro: steps_of(batches, 32) for micro, batches in runs.items()}
    assert steps[8] == steps[4] == steps[2] == steps[1]
    assert all(len(s) == 32 for s in steps[8][:-1]) and len(steps[8][-1]) == length - 32 * (len(steps[8]) - 1)
    assert sorted(i for s in steps[8] for i in s) == sorted(epoch_order(n, length, 11, 0))
    for micro, batches in runs.items():  # a step is whole micro-batches: the Trainer counts micro-batches into steps
        assert all(len(b) == micro for b in batches[:-1])
    for s in steps[8]:  # a step's micro-batches come longest first
        assert list(lengths[s]) == sorted(lengths[s], reverse=True)


def test_the_order_depends_only_on_seed_and_epoch_and_the_longest_step_comes_first():
    n, step = 600, 8
    lengths = preference_lengths(n)

    def batches(seed: int, epoch: int) -> list[list[int]]:
        s = ShardBatchSampler(n, n, 4, seed=seed, lengths=lengths, step=step)
        s.set_epoch(epoch)
        return list(s)

    first = batches(5, 0)
    assert batches(5, 0) == first  # a new process (a resumed attempt) gets the same batches
    assert batches(5, 1) != first and batches(6, 0) != first
    flat = [i for b in first for i in b]
    first_window = flat[: step * WINDOW_STEPS]
    assert lengths[flat[0]] == max(lengths[first_window])  # a plan too tight for this data fails in step 1
    # Steps are shuffled, not laid out shortest to longest: the step means go up and down.
    means = [lengths[s].mean() for s in steps_of(first, step)]
    assert means != sorted(means) and means != sorted(means, reverse=True)


def test_lengths_come_from_the_tokenized_columns():
    from datasets import Dataset

    dpo = Dataset.from_dict({"prompt_ids": [[1] * 5, [1] * 2, [1] * 9], "chosen_ids": [[2] * 3, [2] * 8, [2]],
                             "rejected_ids": [[3] * 4, [3] * 1, [3] * 2]})
    assert example_lengths(dpo).tolist() == [9, 10, 11]  # prompt + the longer answer
    rm = Dataset.from_dict({"chosen_ids": [[1] * 7, [1] * 2], "rejected_ids": [[1] * 3, [1] * 6]})
    assert example_lengths(rm).tolist() == [7, 6]
    sft = Dataset.from_dict({"input_ids": [[1] * 4, [1] * 12, [1] * 1], "labels": [[1] * 4, [1] * 12, [1]]})
    assert example_lengths(sft.filter(lambda e: len(e["input_ids"]) > 1)).tolist() == [4, 12]  # indices mapping
    assert example_lengths(Dataset.from_dict({"text": ["a"]})) is None
