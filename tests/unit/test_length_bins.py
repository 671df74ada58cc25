"""Padded micro-batches by length under a token budget (trainer_kit/length_bins.py, memory/stage_plan.binned): every
micro-batch within its bins' tokens, short conversations many to a bin, every conversation in a step each epoch, an
OOM back-off the same steps in the same order, every rank the same count, and the plan sized to hold about the
planned conversations a step; rm's pairs the same, at 2 sequences a pair in bins of a packed pair row's tokens."""

from __future__ import annotations

import math

import numpy as np
import pytest

from medgpt_ray.config import LoraConfig, SFTStageConfig
from medgpt_ray.memory.budget import make_budget
from medgpt_ray.memory.lengths import BUCKET, LengthProfile
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.memory.shapes import PRESETS
from medgpt_ray.memory.stage_plan import binned, halve_micro_batch
from medgpt_ray.trainer_kit.length_bins import LengthBinSampler, examples_per_bin, rows_per_bin

BIN = 2048


def medical_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Conversation lengths shaped like MedicalGPT's SFT file: p50 ~170, a tail to 2,048."""
    rng = np.random.default_rng(seed)
    return np.minimum(2048, rng.lognormal(5.15, 0.75, n).astype(np.int64) + 20)


def padded_tokens(batch: list[int], lengths: np.ndarray) -> int:
    return len(batch) * math.ceil(max(lengths[i] for i in batch) / BUCKET) * BUCKET


def test_every_micro_batch_fits_its_bins_and_short_ones_hold_many_rows():
    lengths = medical_lengths(3000)
    sampler = LengthBinSampler(lengths, BIN, bins_per_step=8, micro_bins=2, seed=1)
    batches = list(sampler)
    assert len(batches) == len(sampler) == len(sampler.steps) * 4
    assert all(padded_tokens(b, lengths) <= 2 * BIN for b in batches)
    assert max(len(b) for b in batches) >= 16 * 2  # conversations of <= 128 tokens: 16 a bin
    assert min(len(b) for b in batches) == 2  # the longest: one a bin
    seen = {i for b in batches for i in b}
    assert seen == set(range(len(lengths)))  # every conversation, each epoch


def test_a_back_off_trains_the_same_steps_in_the_same_order():
    lengths = medical_lengths(1000, seed=3)
    full = LengthBinSampler(lengths, BIN, bins_per_step=8, micro_bins=4, seed=7)
    half = LengthBinSampler(lengths, BIN, bins_per_step=8, micro_bins=2, seed=7)
    for epoch in (0, 1):
        full.set_epoch(epoch)
        half.set_epoch(epoch)
        assert [i for b in full for i in b] == [i for b in half for i in b]
        assert len(half) == 2 * len(full)
    full.set_epoch(0)
    assert lengths[next(iter(full))[0]] == lengths.max()  # the longest step first in the first epoch
    other = LengthBinSampler(lengths, BIN, bins_per_step=8, micro_bins=4, seed=7)
    other.set_epoch(1)
    full.set_epoch(1)
    assert list(other) == list(full)
    full.set_epoch(2)
    assert list(full) != list(other)  # another epoch, another order


def test_a_shorter_shard_repeats_its_first_steps_to_every_ranks_count():
    sampler = LengthBinSampler(medical_lengths(300), BIN, bins_per_step=4, micro_bins=4, seed=0)
    local = len(sampler.steps)
    sampler.n_steps = local + 3  # the largest shard's, as ShardLoader gathers it
    batches = list(sampler)
    assert len(batches) == len(sampler) == local + 3
    assert batches[local:] == batches[:3]
    with pytest.raises(ValueError, match="3 bins per micro-batch do not divide the 4 bins"):
        LengthBinSampler(medical_lengths(10), BIN, bins_per_step=4, micro_bins=3, seed=0)


def test_the_rows_a_bin_holds_and_their_mean_over_a_sample():
    assert [rows_per_bin(n, BIN) for n in (1, 128, 129, 1000, 2048, 5000)] == [16, 16, 8, 2, 1, 1]
    assert examples_per_bin([100] * 10, BIN) == 16
    assert examples_per_bin([100, 2000], BIN) == pytest.approx(2 / (1 / 16 + 1))  # harmonic: steps of each class


def test_a_packed_plan_the_worker_cannot_pack_is_binned_to_hold_the_planned_conversations():
    card = make_budget(24, 2, "rtx4090", True, "test")
    cfg = SFTStageConfig(method="lora", lora=LoraConfig(rank=8), precision="bf16", seq_len=2048,
                         effective_batch=64)
    profile = LengthProfile.of([170] * 900 + [700] * 100, records=1000, seq_len=2048, conversations_per_row=9.0)
    packed = plan_stage("sft", cfg, 1, True, PRESETS["qwen2.5-1.5b"], card, profile)
    per_bin = examples_per_bin([170] * 900 + [700] * 100, 2048)
    plan = binned(packed, cfg, per_bin)
    bins = plan.length_bins
    assert plan.packing is None and bins["bin_tokens"] == 2048 and bins["conversations_per_step"] == 64
    assert bins["bins_per_step"] == round(64 / per_bin) and plan.micro_batch * plan.grad_accum == bins["bins_per_step"]
    assert plan.micro_batch <= packed.micro_batch and plan.ckpt_fraction == packed.ckpt_fraction
    assert plan.identity() == packed.identity() and plan.examples_per_step == 64
    assert "padded by length" in plan.reasons[-1]
    if plan.micro_batch > 1:  # a back-off keeps the bins per step
        half = halve_micro_batch(plan, cfg, "oom", 1)
        assert half.micro_batch * half.grad_accum == bins["bins_per_step"] and half.length_bins == bins


def pair_lengths(n: int, seed: int = 0) -> np.ndarray:
    """A pair's longer side (prompt + answer), as TRL pads both of its sequences: 60 to 1,024 tokens."""
    rng = np.random.default_rng(seed)
    return np.minimum(1024, rng.lognormal(5.6, 0.6, n).astype(np.int64) + 60)


def padded_pair_tokens(batch: list[int], lengths: np.ndarray) -> int:
    """TRL's preference collator: 2 x pairs sequences, every one padded to the batch's longest (to the bucket)."""
    return 2 * len(batch) * math.ceil(max(lengths[i] for i in batch) / BUCKET) * BUCKET


def test_a_bin_of_pairs_holds_no_more_than_a_packed_pair_row():
    """A packed pair row is 2 x seq_len tokens (reward_packing.row_width); a bin of that many holds the pairs whose
    two sequences, padded to the longer side, fit it."""
    from medgpt_ray.stages.reward_packing import row_width

    row = row_width(1024)
    assert [rows_per_bin(n, row, sequences=2) for n in (1, 128, 129, 256, 1000, 1024)] == [8, 8, 4, 4, 1, 1]
    for n in range(1, 1025, 7):
        assert rows_per_bin(n, row, sequences=2) * 2 * math.ceil(n / BUCKET) * BUCKET <= row
        assert rows_per_bin(n, row, sequences=2) == rows_per_bin(n, row // 2)  # 2 sequences of n in twice the row
    assert examples_per_bin([100] * 4, row, sequences=2) == 8
    lengths = pair_lengths(800)
    sampler = LengthBinSampler(lengths, row, bins_per_step=6, micro_bins=3, seed=4, sequences=2)
    assert all(padded_pair_tokens(b, lengths) <= 3 * row for b in sampler)
    assert max(len(b) for b in sampler) == 3 * 8 and min(len(b) for b in sampler) == 3  # short: 8 a bin; long: 1


def test_every_pair_lands_in_exactly_one_step_and_a_back_off_halves_the_bins_per_micro_batch():
    lengths = pair_lengths(500, seed=5)
    full = LengthBinSampler(lengths, 2048, bins_per_step=4, micro_bins=4, seed=2, sequences=2)
    steps = full.steps
    *whole, last = steps
    # Each pair in exactly one step (the last, short one filled with its own pairs again).
    assert sorted([i for s in whole for i in s] + list(set(last))) == list(range(500))
    assert all(len(s) == 4 * rows_per_bin(int(lengths[s[0]]), 2048, 2) for s in steps)  # a step: 4 full bins
    half = LengthBinSampler(lengths, 2048, bins_per_step=4, micro_bins=2, seed=2, sequences=2)
    for epoch in (0, 1):
        full.set_epoch(epoch)
        half.set_epoch(epoch)
        assert [i for b in half for i in b] == [i for b in full for i in b] and len(half) == 2 * len(full)
        assert all(padded_pair_tokens(b, lengths) <= 2 * 2048 for b in half)


def test_a_packed_rm_plan_is_binned_in_pairs_at_a_packed_rows_width():
    """rm's packed plan, binned: bins of 2 x seq_len tokens, 2 sequences a pair, effective_batch pairs a step, the
    packed plan's checkpointing; an OOM back-off halves the bins per micro-batch and keeps the bins."""
    from medgpt_ray.config import RMStageConfig
    from medgpt_ray.memory.format import plan_line
    from medgpt_ray.memory.stage_plan import bin_shape

    card = make_budget(24, 2, "rtx4090", True, "test")
    cfg = RMStageConfig(method="lora", lora=LoraConfig(rank=8), precision="bf16", seq_len=1024, effective_batch=64,
                        packing=True)
    lengths = pair_lengths(1000, seed=1).tolist()
    profile = LengthProfile.of(lengths, records=1000, seq_len=1024, conversations_per_row=3.0)
    packed = plan_stage("rm", cfg, 1, True, PRESETS["qwen2.5-1.5b"], card, profile)
    assert packed.packing is not None and bin_shape(packed, cfg) == (2048, 2)
    per_bin = examples_per_bin(lengths, 2048, sequences=2)
    plan = binned(packed, cfg, per_bin)
    bins = plan.length_bins
    assert plan.packing is None and bins["bin_tokens"] == 2048 and bins["sequences_per_example"] == 2
    assert bins["bins_per_step"] == round(64 / per_bin) == plan.micro_batch * plan.grad_accum
    assert plan.examples_per_step == 64 and plan.ckpt_fraction == packed.ckpt_fraction
    assert plan.micro_batch <= packed.micro_batch and plan.identity() == packed.identity()
    assert "padded by length" in plan.reasons[-1] and "pairs a bin" in plan.reasons[-1]
    assert plan_line(plan).startswith(f"lora, padded by length: {plan.micro_batch} bins of up to 2048 tokens")
    sft = SFTStageConfig(method="lora", lora=LoraConfig(rank=8), seq_len=1024)
    assert bin_shape(plan_stage("sft", sft, 1, True, PRESETS["qwen2.5-1.5b"], card, profile), sft) == (1024, 1)
    if plan.micro_batch > 1:
        half = halve_micro_batch(plan, cfg, "oom", 1)
        assert half.micro_batch * half.grad_accum == bins["bins_per_step"] and half.length_bins == bins
