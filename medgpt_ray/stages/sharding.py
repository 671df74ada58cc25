"""Each training worker reads its own shard of the train split, and trains on it as it is.

The worker's records are rows [k*n // N, (k+1)*n // N) of the hash-ordered train file (data/shards.py), N the
stage's Ray Train workers (the plan's num_workers; WORLD_SIZE in the worker). HF/accelerate would split the train
dataloader across ranks again (each worker would see 1/N of 1/N), so the trainer's class is swapped for a subclass
whose `get_train_dataloader` prepares the loader for one process (device placement, accelerate's skip/epoch
handling) without that split: the pattern of Ray's `prepare_trainer`. The order of the examples depends only on
(seed, epoch, shard): HF's resume ("skip the first k batches of the epoch") skips exactly what was trained, also
after an OOM back-off (half the micro-batch, twice the accumulation: the same examples per step, in the same
order). A different number of workers is a different plan identity, so a stage is never resumed across it.

Every rank must take the same number of batches per epoch (the gradient all-reduce is collective), but shards
differ by a record, and packing (pt's blocks, sft's rows) or sft's too-long filter make the examples per shard
differ more: the sampler pads each epoch to the largest shard's example count by repeating the epoch's first
examples, as torch's DistributedSampler and accelerate's `even_batches` do. `micro_batch x grad_accum x N` examples
per optimizer step, as before; a packed SFT stage's examples are its packed rows (stages/packing.py).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from medgpt_ray.data.shards import num_rows, read_records, read_shard


def this_worker() -> tuple[int, int]:
    """(rank, world size) of this training worker; (0, 1) in a plain process."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def read_train_shard(path: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """This worker's train records, and what it read (for the stage's result)."""
    rank, world = this_worker()
    records, rows = read_shard(path, world, rank)
    return records, {"rank": rank, "shards": world, "rows": list(rows), "split_rows": num_rows(path)}


def read_eval(path: str) -> list[dict[str, Any]]:
    """The held-out records, whole (HF splits the evaluation across ranks)."""
    return read_records(path)


def epoch_order(n: int, length: int, seed: int, epoch: int) -> list[int]:
    """`length` indices into `n` examples: a permutation fixed by (seed, epoch), wrapped around when length > n."""
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return np.resize(perm, length).tolist() if n else []


class ShardBatchSampler:
    """Micro-batches of one shard's examples for one epoch, padded to `length` examples (every rank's count)."""

    def __init__(self, n: int, length: int, batch_size: int, seed: int, drop_last: bool = False):
        self.n, self.length, self.batch_size, self.seed, self.drop_last = n, length, batch_size, seed, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = epoch_order(self.n, self.length, self.seed, self.epoch)
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        for i in range(0, stop, self.batch_size):
            yield order[i : i + self.batch_size]

    def __len__(self) -> int:
        full, rest = divmod(self.length, self.batch_size)
        return full + int(rest > 0 and not self.drop_last)


def _examples_on_every_rank(trainer, n: int) -> int:
    """The largest shard's example count (a collective: every rank calls it at the same point)."""
    import torch

    if trainer.accelerator.num_processes == 1:
        return n
    counts = trainer.accelerator.gather(torch.tensor([n], device=trainer.accelerator.device))
    return int(counts.max().item())


class _CountingCollator:
    """The train collator, counting the examples it collates (what this worker trained on, for the result), and
    for packed rows (stages/packing.py) the conversations in them."""

    def __init__(self, collate, info: dict[str, Any]):
        self.collate, self.info = collate, info

    def __call__(self, examples):
        self.info["trained_examples"] = self.info.get("trained_examples", 0) + len(examples)
        if examples and "seq_lengths" in examples[0]:
            self.info["trained_conversations"] = (self.info.get("trained_conversations", 0)
                                                  + sum(len(e["seq_lengths"]) for e in examples))
        return self.collate(examples)


def shard_dataloader(trainer):
    """The train DataLoader over this worker's shard as it is, prepared by accelerate for a single process."""
    import datasets
    from accelerate.data_loader import prepare_data_loader
    from torch.utils.data import DataLoader

    args, dataset = trainer.args, trainer.train_dataset
    if dataset is None:
        raise ValueError("Trainer: training requires a train_dataset.")
    if isinstance(dataset, datasets.Dataset):
        dataset = trainer._remove_unused_columns(dataset, description="training")
    n = len(dataset)
    seed = args.data_seed if args.data_seed is not None else args.seed
    info = trainer.medgpt_shard
    info.update(examples=n, epoch_examples=_examples_on_every_rank(trainer, n))
    sampler = ShardBatchSampler(n, info["epoch_examples"], trainer._train_batch_size, seed, args.dataloader_drop_last)
    # A packed stage collates its train rows itself (stages/packing.py); evaluation keeps the trainer's collator.
    collate = getattr(trainer, "medgpt_collate", None) or trainer.data_collator
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=_CountingCollator(collate, info),
                        num_workers=args.dataloader_num_workers, pin_memory=args.dataloader_pin_memory,
                        persistent_workers=args.dataloader_persistent_workers and args.dataloader_num_workers > 0,
                        prefetch_factor=args.dataloader_prefetch_factor)
    # num_processes=1: no BatchSamplerShard around our sampler; the batches still go to the worker's device.
    return prepare_data_loader(loader, device=trainer.accelerator.device, num_processes=1, process_index=0,
                               put_on_device=True, dispatch_batches=False, even_batches=False)


_CLASSES: dict[type, type] = {}


def install_shard(trainer, shard: dict[str, Any]) -> None:
    """Make this trainer train on its worker's shard as it is (its class swapped for a cached subclass that
    overrides only get_train_dataloader). `shard` is what read_train_shard said; the loader adds its counts."""
    trainer.medgpt_shard = shard
    base = type(trainer)
    if base in _CLASSES.values():
        return
    if base not in _CLASSES:
        _CLASSES[base] = type(f"Shard{base.__name__}", (base,), {
            "get_train_dataloader": lambda self: shard_dataloader(self),
            "__doc__": f"{base.__name__} over its worker's shard of the train split (stages/sharding.py).",
        })
    trainer.__class__ = _CLASSES[base]


def shard_report(trainer) -> dict[str, Any] | None:
    """What this worker read and trained on: rank, row range, examples, examples per epoch (padded), and the
    examples it trained on in this attempt (a resumed attempt does not count the batches it skipped)."""
    info = getattr(trainer, "medgpt_shard", None)
    return dict(info) if info is not None else None
