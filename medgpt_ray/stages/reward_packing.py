"""Reward-model training on packed pairs, padding-free: TRL's Bradley-Terry loss on pairs packed into rows.

TRL's RewardTrainer pads every chosen and rejected sequence of a micro-batch to the longest one; on real preference
data (answers of 200-1,500 tokens) that left the H200 padding-bound at 69 % fill. Here the train split's pairs are
packed as units, by the same best-fit decreasing as SFT's rows (trainer_kit/packed_rows.py), into rows of 2 x
seq_len tokens: a pair's two sequences are at most seq_len each (encode_pairs cuts them), so every pair fits in one
row, its chosen and rejected sequences side by side, and a pair never spans two rows or two micro-batches. A micro-
batch of m rows holds the tokens of m pairs at their longest, what an unpacked micro-batch of m pairs is planned
for.

Each sequence is a segment: position ids restart at 0 at every one (and at the row's tail padding), there is no
attention_mask, use_cache=False, so SDPA and eager get the block-diagonal causal mask exactly as SFT's rows do
(trainer_kit/packed_attention.py checks the loaded model). Under FlashAttention the micro-batch's rows are flattened
into one unpadded sequence for the varlen kernel, which reads the position ids (not run here, no FlashAttention on
CPU: the flattened layout is tested under SDPA, which masks it the same way).

The forward (stages/reward_trainer.py's PackedRewardTrainer) is the model's own, through whatever wraps it (PEFT's
SEQ_CLS model, DeepSpeed, DDP, compiled layers), so every hook and gradient sync runs as in TRL's. A
sequence-classification model scores every position with its `score` head and keeps the one of each row's last
non-pad token; a forward hook on the head keeps all positions' scores instead, and the loss reads each segment's
last non-pad token: the token TRL's padded batch scores for that sequence. The loss and the logged metrics are TRL's
RewardTrainer.compute_loss (trl 1.16): -logsigmoid(chosen - rejected) averaged over the micro-batch's pairs, plus
center_rewards_coefficient x mean((chosen + rejected)^2); min/mean/max reward, accuracy, margin, num_tokens (the
real tokens). A micro-batch's loss is the mean over its pairs, as TRL's is; packed micro-batches hold different
numbers of pairs, and each micro-batch weighs the same in the step. Evaluation stays unpacked (TRL's collator and
loss). Pairs with a `margin` are not packed (encode_pairs makes none).
"""

from __future__ import annotations

from typing import Any

import torch

from medgpt_ray.trainer_kit.packed_attention import ROWS
from medgpt_ray.trainer_kit.packed_rows import CONVERSATIONS_KEY, TOKENS_KEY, pack, row_tensors

ENDS_KEY = "medgpt_segment_ends"  # flat indices of each segment's scored token: chosen, rejected of each pair
PACKED_COLUMNS = ("input_ids", "position_ids", "seq_lengths")  # what a packed train row holds


def row_width(seq_len: int) -> int:
    """Packed rm rows hold whole pairs: two sequences of at most seq_len tokens each."""
    return 2 * seq_len


def pack_pairs(dataset: Any, seq_len: int) -> Any:
    """encode_pairs' dataset (chosen_ids, rejected_ids) -> rows of at most 2 x seq_len tokens: each pair chosen then
    rejected, position ids restarting at each, `seq_lengths` one entry per pair (best-fit decreasing on the pair's
    two lengths together)."""
    from datasets import Dataset

    ids, positions = [], []
    for chosen, rejected in zip(dataset["chosen_ids"], dataset["rejected_ids"], strict=True):
        ids.append(list(chosen) + list(rejected))
        positions.append(list(range(len(chosen))) + list(range(len(rejected))))
    pairs = Dataset.from_dict({"input_ids": ids, "position_ids": positions})
    return pack(pairs, row_width(seq_len), columns=("input_ids", "position_ids"))


def scored_tokens(ids: list[int], positions: list[int], pad_id: int) -> list[int]:
    """Per segment (a new one wherever the position is 0), the index of its rightmost non-pad token, else its first
    token: what a sequence-classification model scores for that sequence padded alone (transformers'
    GenericForSequenceClassification)."""
    starts = [i for i, p in enumerate(positions) if p == 0]
    out = []
    for s, e in zip(starts, [*starts[1:], len(ids)], strict=True):
        real = [i for i in range(s, e) if ids[i] != pad_id]
        out.append(real[-1] if real else s)
    return out


class PairRowsCollator:
    """The train collate of packed pair rows: [rows, 2 x seq_len] input_ids and position_ids (ROWS), or the rows'
    real tokens as one sequence (FLAT); the scored token of every segment (ENDS_KEY), and the real tokens and pairs
    (TOKENS_KEY, CONVERSATIONS_KEY) that PackedCounts (trainer_kit/packed_counts.py) takes out before the model."""

    def __init__(self, mode: str, pad_id: int, seq_len: int):
        self.mode, self.pad_id, self.width = mode, pad_id, row_width(seq_len)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        ends: list[int] = []
        offset = 0
        for ex in examples:
            ids, positions = list(ex["input_ids"]), list(ex["position_ids"])
            ends += [offset + i for i in scored_tokens(ids, positions, self.pad_id)]
            offset += self.width if self.mode == ROWS else len(ids)
        if self.mode == ROWS:
            input_ids, position_ids = row_tensors(examples, self.pad_id, self.width)
        else:
            input_ids = torch.tensor([[t for ex in examples for t in ex["input_ids"]]])
            position_ids = torch.tensor([[p for ex in examples for p in ex["position_ids"]]])
        real = sum(len(ex["input_ids"]) for ex in examples)
        return {"input_ids": input_ids, "position_ids": position_ids, ENDS_KEY: torch.tensor(ends),
                TOKENS_KEY: torch.tensor(real),
                CONVERSATIONS_KEY: torch.tensor(sum(len(ex["seq_lengths"]) for ex in examples))}
