"""Padded micro-batches by length, under a token budget: what a stage trains when its plan was packed and its worker's
model cannot pack (stages/packing.py, memory/stage_plan.binned).

A packed row holds seq_len tokens of several conversations; a bin holds as many conversations of similar length as
fit `bin_tokens` once padded (rows x their longest, rounded up to the BUCKET multiple the compiled layers see), so a
micro-batch of m bins needs no more memory than the m packed rows the plan was checked for (padded rows attend
within themselves: less than a packed row's mask). Short conversations then fill a micro-batch with many rows where
a fixed micro-batch size would leave it mostly empty (Qwen3.5 planned at "micro-batch 8 at 2,048 tokens" padded,
for conversations of p50 173 tokens, trained 0.24x the dense model's tokens/s).

Reward pairs (rm) are binned the same way with `sequences` 2: TRL's preference collator lays a micro-batch of k
pairs out as 2k sequences (the chosen ones, then the rejected), all padded to the micro-batch's longest, so a pair
costs 2 x its longer side padded. Their packed row is 2 x seq_len wide and was priced as that many tokens (the
estimator's tokens are micro_batch x 2 x seq_len; reward_packing.row_width), so a bin of `bin_tokens` = that width
holds bin_tokens // (2 x padded longer side) pairs: memory/stage_plan.bin_shape gives both numbers.

A step is `bins_per_step` bins of one length class: the shard sorted by length (ties in a seeded order), cut from
the longest into steps of bins_per_step x rows_per_bin examples, rows_per_bin set by the step's longest. The
steps are fixed for the run and their order shuffled per epoch (the longest first in the first epoch, so a plan
that is too tight fails at once). The examples per step vary with their length, as packed rows' do. The loss is
normalised as the packed path normalises it: conversations over the step's real tokens (trainer_kit/sync_free.py);
pairs by TRL's RewardTrainer, a mean over a micro-batch's pairs with every micro-batch weighing the same in the
step, as packed pair rows do (stages/reward_packing.py); a step's micro-batches here hold the same number of pairs,
so that is the mean over the step's pairs on each rank. An OOM back-off halves the bins per micro-batch: the same
steps, in the same order, in twice as many micro-batches. Every rank takes the same number of steps (the largest
shard's: a shard with fewer repeats its first ones), as ShardBatchSampler does."""

from __future__ import annotations

import math

import numpy as np

from medgpt_ray.memory.lengths import BUCKET


def rows_per_bin(length: int, bin_tokens: int, sequences: int = 1) -> int:
    """Examples of up to `length` tokens a sequence a bin of `bin_tokens` holds, each `sequences` sequences (a
    pair: 2) padded to the bucket (at least one)."""
    return max(1, bin_tokens // (sequences * math.ceil(max(length, 1) / BUCKET) * BUCKET))


def examples_per_bin(lengths: list[int] | np.ndarray, bin_tokens: int, sequences: int = 1) -> float:
    """The examples a bin holds on average over a step's worth of them: the harmonic mean of rows_per_bin over the
    examples (a step's count is set by its own length class), for sizing the bins per step."""
    if len(lengths) == 0:
        return 1.0
    inverse = [1 / rows_per_bin(int(n), bin_tokens, sequences) for n in lengths]
    return len(inverse) / sum(inverse)


def binned_steps(lengths: np.ndarray, bin_tokens: int, bins_per_step: int, seed: int,
                 sequences: int = 1) -> list[list[int]]:
    """The shard's steps: indices sorted by length, longest first (ties in a `seed` order), each step
    bins_per_step x rows_per_bin(its longest) of them. The last step, short, is filled by repeating its own
    examples (none longer than its longest, so its bins stay within budget)."""
    n = len(lengths)
    if n == 0:
        return []
    tiebreak = np.random.default_rng([seed, 2]).permutation(n)
    order = tiebreak[np.argsort(-lengths[tiebreak], kind="stable")].tolist()
    steps, pos = [], 0
    while pos < n:
        size = bins_per_step * rows_per_bin(int(lengths[order[pos]]), bin_tokens, sequences)
        step = order[pos:pos + size]
        pos += size
        steps.append(step + [step[i % len(step)] for i in range(size - len(step))])
    return steps


class LengthBinSampler:
    """Micro-batches of `micro_bins` bins each, step after step, for one epoch (`set_epoch`); `steps` every rank
    takes (at least this shard's); `sequences` each example pads to (a pair: 2). Its length is the epoch's
    micro-batch count."""

    def __init__(self, lengths: np.ndarray, bin_tokens: int, bins_per_step: int, micro_bins: int, seed: int,
                 steps: int | None = None, sequences: int = 1):
        if bins_per_step % micro_bins:
            raise ValueError(f"{micro_bins} bins per micro-batch do not divide the {bins_per_step} bins of a step")
        self.bin_tokens, self.bins_per_step, self.micro_bins, self.seed = bin_tokens, bins_per_step, micro_bins, seed
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.steps = binned_steps(self.lengths, bin_tokens, bins_per_step, seed, sequences)
        self.n_steps = max(steps or 0, len(self.steps))
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def epoch_steps(self) -> list[list[int]]:
        """This epoch's steps in order: the shard's shuffled by (seed, epoch), the longest first in epoch 0, then
        its first ones again up to the steps every rank takes."""
        if not self.steps:
            return []
        perm = np.random.default_rng([self.seed, self.epoch, 3]).permutation(len(self.steps)).tolist()
        if self.epoch == 0:
            perm = [0, *[p for p in perm if p != 0]]
        ordered = [self.steps[p] for p in perm]
        return [ordered[i % len(ordered)] for i in range(self.n_steps)]

    def __iter__(self):
        for step in self.epoch_steps():
            rows = len(step) // self.bins_per_step * self.micro_bins
            for i in range(0, len(step), rows):
                yield step[i:i + rows]

    def __len__(self) -> int:
        return self.n_steps * (self.bins_per_step // self.micro_bins) if self.steps else 0
