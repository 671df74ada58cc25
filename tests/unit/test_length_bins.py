"""Padded micro-batches by length under a token budget (trainer_kit/length_bins.py, memory/stage_plan.binned): every
micro-batch within its bins' tokens, short conversations many to a bin, every conversation in a step each epoch, an
OOM back-off the same steps in the same order, every rank the same count, and the plan sized to hold about the
planned conversations a step."""

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
