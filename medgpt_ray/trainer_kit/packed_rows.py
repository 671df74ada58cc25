"""SFT packing, padding-free: the encoded conversations packed into rows of seq_len tokens, each attending only to
itself.

Rows are made by TRL's own best-fit-decreasing packer (`trl.data_utils.pack_dataset`, strategy "bfd"); every
conversation fits whole (encode_sft already cut it to seq_len), and labels stay as encode_sft made them
(response-only), with the first token of each conversation never a target, as in an unpacked row.

How the model keeps a row's conversations apart depends on its attention:
- SDPA and eager (what our users run): a micro-batch is [rows, seq_len] input_ids/labels/position_ids and NO
  attention_mask. Position ids restart at 0 at every conversation, so transformers' masking_utils
  (`find_packed_sequence_indices` in `create_causal_mask`) builds a causal mask that is block-diagonal per row.
  The row's tail padding restarts at 0 too (its own block, labels -100): it never joins the last conversation.
  transformers reads packed position ids only when the forward has no KV cache: training passes use_cache=False
  (TRL's loss and trainer_kit/sync_free.py both do).
  That the loaded model really gets such a mask is checked before training (`attention_path`,
  trainer_kit/packed_attention.py): the mask its first full-attention layer receives for packed position ids must
  be exactly block-diagonal. A hybrid's linear-attention layers take no mask and get no boundaries here: such a
  model is not packed on this path (trainer_kit/linear_attention.py).
- FlashAttention: TRL's padding-free collator, as TRL means it: the micro-batch's rows flattened into one sequence
  with cu_seq_lens for the varlen kernel. (TRL's `packing=True` does this for every attention; under SDPA the
  flattened sequence gets one dense (rows x seq_len)^2 mask, hence our own rows path.) Its cu_seq_lens_q and
  seq_idx also reach a hybrid's linear-attention layers: packed there only with their kernels installed.

effective_batch keeps counting conversations. The HF Trainer's accumulation is fixed, so a step is a fixed number of
packed rows, sized so that it holds about as many conversations as the plan's per-worker batch:
rows_per_step = round(planned conversations per step / conversations per row), the latter measured by packing the
first SAMPLE_RECORDS records of the train split (hash order: a uniform sample, the same on every worker, so every
worker takes the same accumulation without a collective). The pipeline measures it on the driver and plans the
micro-batch in rows (memory/lengths.py, plan.packing); a plan made without the data (a Tune trial) is sized by
stages/packing.py with memory/stage_plan.packed_rows. The real number of conversations per step is logged
(`conversations_per_step`).

Tokens are counted honestly: each packed micro-batch carries its number of real (non-padding) tokens and
conversations, which PackedCounts' training_step (trainer_kit/packed_counts.py) takes out of the batch before the
model sees it and adds to `state.num_input_tokens_seen` (gathered over ranks, as HF's own count is): tokens/s in
metrics.jsonl, the progress line and Prometheus are non-padding tokens. HF's own counter is off for packed stages:
without an attention mask it would compare input ids with the pad id, which is also a real token wherever pad = eos.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from medgpt_ray.trainer_kit.packed_attention import FLAT

TOKENS_KEY, CONVERSATIONS_KEY = "medgpt_real_tokens", "medgpt_conversations"  # taken out before the model


def pack(dataset: Any, seq_len: int, columns: Sequence[str] = ("input_ids", "labels")) -> Any:
    """Encoded examples (`columns`, one value per token: conversations' input_ids and labels, or a reward pair's
    tokens and position ids) -> rows of at most seq_len tokens with each example's length in `seq_lengths`, by
    TRL's best-fit decreasing over the whole dataset at once (one map batch, so no bin is cut short)."""
    from trl.data_utils import pack_dataset

    selected = dataset.select_columns(list(columns))
    return pack_dataset(selected, seq_len, "bfd", {"batch_size": max(len(selected), 1)})


@dataclass(frozen=True)
class PackedShape:
    rows: int
    conversations: int  # the examples packed: conversations, or reward pairs (stages/reward_packing.py)
    tokens: int  # real (non-padding) tokens
    seq_len: int  # the rows' width

    @classmethod
    def of(cls, packed: Any, seq_len: int) -> PackedShape:
        lengths = packed["seq_lengths"]
        return cls(len(lengths), sum(len(x) for x in lengths), sum(sum(x) for x in lengths), seq_len)

    @property
    def conversations_per_row(self) -> float:
        return self.conversations / max(self.rows, 1)

    def report(self, unit: str = "conversations") -> dict[str, Any]:
        """rows, examples (`unit`) per row and fill (real tokens / the rows' slots), for the stage result."""
        return {"rows": self.rows, unit: self.conversations,
                f"{unit}_per_row": round(self.conversations_per_row, 3),
                "fill": round(self.tokens / max(self.rows * self.seq_len, 1), 4)}


def segment_positions(lengths: Sequence[int], width: int) -> torch.Tensor:
    """A row's position ids: 0.. at every segment of `lengths`, and again at the tail padding up to `width`."""
    n = sum(lengths)
    return torch.cat([torch.arange(k) for k in [*lengths, width - n] if k > 0])


def row_tensors(examples: list[dict[str, Any]], pad_id: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, width] input_ids (pad_id after the real tokens) and position ids: the example's own `position_ids`
    where it has them (segments inside an example, as a reward pair's two sequences), else restarting at each of
    its `seq_lengths`; the tail padding is a segment of its own."""
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(examples), width), dtype=torch.long)
    for r, ex in enumerate(examples):
        n = len(ex["input_ids"])
        input_ids[r, :n] = torch.as_tensor(ex["input_ids"])
        if "position_ids" in ex:
            position_ids[r, :n] = torch.as_tensor(ex["position_ids"])
            position_ids[r, n:] = torch.arange(width - n)
        else:
            position_ids[r] = segment_positions(list(ex["seq_lengths"]), width)
    return input_ids, position_ids


def collate_rows(examples: list[dict[str, Any]], pad_id: int, width: int) -> dict[str, torch.Tensor]:
    """[rows, width] input_ids, labels and position_ids (restarting at 0 at each conversation and at the tail
    padding), no attention_mask; the first token of every conversation is no target (the previous conversation's
    last token must not learn to predict it).

    A row filled to the last token by its conversations ends in a one-token segment (its last position id is 0,
    its label kept): transformers returns no mask at all for a batch of rows that each look like one sequence, and
    compiled layers would compile again for that batch (bench: a 12 s step). The last token's output predicts
    nothing and no earlier token attends to it, so the loss and every gradient are unchanged."""
    rows = len(examples)
    input_ids, position_ids = row_tensors(examples, pad_id, width)
    labels = torch.full((rows, width), -100, dtype=torch.long)
    for r, ex in enumerate(examples):
        lengths = list(ex["seq_lengths"])
        n = sum(lengths)
        labels[r, :n] = torch.as_tensor(ex["labels"])
        if n == width:
            position_ids[r, -1] = 0
        starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)
        labels[r, starts] = -100
    return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}


class PackedCollator:
    """The train loader's collate for packed rows; every batch also carries its real tokens and conversations
    (TOKENS_KEY, CONVERSATIONS_KEY), which PackedCounts' training_step takes out before the model."""

    def __init__(self, mode: str, pad_id: int, seq_len: int):
        self.mode, self.pad_id, self.seq_len = mode, pad_id, seq_len
        if mode == FLAT:
            from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

            self._flat = DataCollatorForLanguageModeling(pad_token_id=pad_id, padding_free=True)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = (self._flat(examples) if self.mode == FLAT else collate_rows(examples, self.pad_id, self.seq_len))
        lengths = [list(ex["seq_lengths"]) for ex in examples]
        batch[TOKENS_KEY] = torch.tensor(sum(sum(x) for x in lengths))
        batch[CONVERSATIONS_KEY] = torch.tensor(sum(len(x) for x in lengths))
        return batch
