"""Each training worker reads its own shard of the train split, and trains on it as it is.

The worker's records are rows [k*n // N, (k+1)*n // N) of the hash-ordered train file (data/shards.py), N the
stage's Ray Train workers (the plan's num_workers; WORLD_SIZE in the worker). HF/accelerate would split the train
dataloader across ranks again (each worker would see 1/N of 1/N), so the stage's trainer class has ShardLoader
(trainer_kit/sharding.py), whose `get_train_dataloader` prepares the loader for one process (device placement,
accelerate's skip/epoch handling) without that split: the pattern of Ray's `prepare_trainer`. The order of the
examples depends only on (seed, epoch, shard): HF's resume ("skip the first k batches of the epoch") skips exactly
what was trained, also after an OOM back-off (half the micro-batch, twice the accumulation: the same examples per
step, in the same order). A different number of workers is a different plan identity, so a stage is never resumed
across it.

Every rank must take the same number of batches per epoch (the gradient all-reduce is collective), but shards
differ by a record, and packing (pt's blocks, sft's rows) or sft's too-long filter make the examples per shard
differ more: the sampler pads each epoch to the largest shard's example count by repeating the epoch's first
examples, as torch's DistributedSampler and accelerate's `even_batches` do. `micro_batch x grad_accum x N` examples
per optimizer step, as before; a packed SFT stage's examples are its packed rows (trainer_kit/packed_rows.py).

Grouped by length (`group_by_length`, rm, dpo and unpacked sft): a micro-batch is padded to its longest example, so
random batches of 200-1,500-token pairs spend about a fifth of their slots on padding. The grouping works on whole
optimizer steps, never on micro-batches, because an OOM back-off changes the micro-batch but must keep every step's
examples and their order: the epoch's order (as above) is cut into windows of WINDOW_STEPS steps (`micro_batch x
grad_accum` examples each, a product the back-off keeps); each window is sorted by length, longest first, and cut
into steps, and the window's steps are shuffled by the (seed, epoch) generator. A step is a run of similar lengths,
sorted within, so its micro-batches pad little at any split. Every rank has the same example count, so the same
windows and the same shuffle: step k of every rank is the same length quantile of its window, and ranks wait little
for each other at the all-reduce. The first step of an epoch is the first window's longest, so a plan that is too
tight fails in its first step (HF's LengthGroupedSampler does the same). The epoch's last, partial step stays last
(HF counts micro-batches into steps, so a short step in the middle would shift every step after it).
"""

from __future__ import annotations

import numpy as np


def epoch_order(n: int, length: int, seed: int, epoch: int) -> list[int]:
    """`length` indices into `n` examples: a permutation fixed by (seed, epoch), wrapped around when length > n."""
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return np.resize(perm, length).tolist() if n else []


WINDOW_STEPS = 50  # steps sorted together: HF's LengthGroupedSampler sorts 50 micro-batches at a time


def grouped_order(order: list[int], lengths: np.ndarray, step: int, seed: int, epoch: int) -> list[int]:
    """`order` regrouped by length at the optimizer-step level: windows of WINDOW_STEPS steps of `step` examples,
    each sorted longest first and cut into steps, the steps shuffled by (seed, epoch); the first window's longest
    step first, the epoch's partial step last. Depends on `order`, the lengths and `step` only, never on how a step
    is split into micro-batches."""
    rng = np.random.default_rng([seed, epoch, 1])  # its own stream: the epoch's permutation is epoch_order's
    idx = np.asarray(order, dtype=np.int64)
    out: list[np.ndarray] = []
    window = step * WINDOW_STEPS
    for start in range(0, len(idx), window):
        chunk = idx[start : start + window]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]  # ties keep the shuffled order
        full = len(chunk) // step
        perm = rng.permutation(full)
        if start == 0 and full:
            perm = np.concatenate([[0], perm[perm != 0]])  # the longest step first
        out.extend(chunk[p * step : (p + 1) * step] for p in perm)
        out.append(chunk[full * step :])  # the partial step: only the last window has one
    return np.concatenate(out).tolist() if out else []


class ShardBatchSampler:
    """Micro-batches of one shard's examples for one epoch, padded to `length` examples (every rank's count);
    grouped by length per optimizer step of `step` examples when `lengths` are given."""

    def __init__(self, n: int, length: int, batch_size: int, seed: int, drop_last: bool = False,
                 lengths: np.ndarray | None = None, step: int | None = None):
        self.n, self.length, self.batch_size, self.seed, self.drop_last = n, length, batch_size, seed, drop_last
        self.lengths, self.step = lengths, step or batch_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = epoch_order(self.n, self.length, self.seed, self.epoch)
        if self.lengths is not None:
            order = grouped_order(order, self.lengths, self.step, self.seed, self.epoch)
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        for i in range(0, stop, self.batch_size):
            yield order[i : i + self.batch_size]

    def __len__(self) -> int:
        full, rest = divmod(self.length, self.batch_size)
        return full + int(rest > 0 and not self.drop_last)


def examples_on_every_rank(trainer, n: int) -> int:
    """The largest shard's example count (a collective: every rank calls it at the same point)."""
    import torch

    if trainer.accelerator.num_processes == 1:
        return n
    counts = trainer.accelerator.gather(torch.tensor([n], device=trainer.accelerator.device))
    return int(counts.max().item())


def example_lengths(dataset) -> np.ndarray | None:
    """Each example's length in tokens as its micro-batch pads it, from the tokenized columns (Arrow list lengths,
    no row is decoded): a DPO pair (TRL's prompt_ids/chosen_ids/rejected_ids) the prompt and its longer answer, a
    reward or ORPO/CPO pair (chosen and rejected ids, prompt included) its longer side, a KTO example its prompt
    and completion, an SFT conversation its input_ids.
    None for a dataset with none of these."""
    import pyarrow.compute as pc

    columns = set(dataset.column_names)
    table = dataset.with_format("arrow")  # column reads honour a filter's indices mapping

    def n(column: str) -> np.ndarray:
        return pc.list_value_length(table[column]).to_numpy(zero_copy_only=False).astype(np.int64)

    if {"chosen_input_ids", "rejected_input_ids"} <= columns:  # TRL's ORPO/CPO rows: prompt in both sequences
        return np.maximum(n("chosen_input_ids"), n("rejected_input_ids"))
    if {"chosen_ids", "rejected_ids"} <= columns:
        longer = np.maximum(n("chosen_ids"), n("rejected_ids"))
        return longer + n("prompt_ids") if "prompt_ids" in columns else longer
    if {"prompt_ids", "completion_ids"} <= columns:  # TRL's KTO rows: one completion per example
        return n("prompt_ids") + n("completion_ids")
    return n("input_ids") if "input_ids" in columns else None


