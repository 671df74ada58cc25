"""A trainer that trains on its worker's shard as it is (trainer_kit/shard_sampler.py says why and in what order):
ShardLoader, composed into the stage's trainer class, and what a worker reads and reports."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from medgpt_ray.data.shards import num_rows, read_records, read_shard
from medgpt_ray.trainer_kit.length_bins import LengthBinSampler
from medgpt_ray.trainer_kit.shard_sampler import ShardBatchSampler, example_lengths, examples_on_every_rank


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


class CountingCollator:
    """The train collator, counting the examples it collates (what this worker trained on, for the result), for
    packed rows (trainer_kit/packed_rows.py) the conversations in them, and for padded batches the real tokens
    against the padded slots (`fill`) and how many sequence lengths the model saw (`padded_lengths`; bucket padding
    bounds it)."""

    def __init__(self, collate, info: dict[str, Any]):
        self.collate, self.info = collate, info
        self.lengths: set[int] = set()
        self.real = self.slots = 0

    def __call__(self, examples):
        self.info["trained_examples"] = self.info.get("trained_examples", 0) + len(examples)
        if examples and "seq_lengths" in examples[0]:
            self.info["trained_conversations"] = (self.info.get("trained_conversations", 0)
                                                  + sum(len(e["seq_lengths"]) for e in examples))
        batch = self.collate(examples)
        mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
        if mask is not None and mask.dim() == 2:
            self.real, self.slots = self.real + int(mask.sum()), self.slots + mask.numel()
            self.lengths.add(int(mask.shape[1]))
            self.info.update(fill=round(self.real / max(self.slots, 1), 4), padded_lengths=len(self.lengths))
        return batch


def single_process_loader(trainer: Any, loader: Any) -> Any:
    """`loader` prepared by accelerate for one process: num_processes=1, so no BatchSamplerShard around its
    sampler; the batches still go to the worker's device."""
    from accelerate.data_loader import prepare_data_loader

    return prepare_data_loader(loader, device=trainer.accelerator.device, num_processes=1, process_index=0,
                               put_on_device=True, dispatch_batches=False, even_batches=False)


class ShardLoader:
    """A trainer whose train DataLoader is its worker's shard as it is. Constructor keywords: `shard`, what
    read_train_shard said (the loader adds its counts: the stage's result reads them from `shard_report`);
    `group_by_length`, whether steps are grouped by length; `train_collate`, the collate of packed train rows
    (trainer_kit/packed_rows.py) in place of the trainer's collator (evaluation keeps the trainer's)."""

    def __init__(self, *args: Any, shard: dict[str, Any], group_by_length: bool = False,
                 train_collate: Callable[[list[dict[str, Any]]], Any] | None = None, **kwargs: Any):
        self.shard_info, self.group_by_length = shard, group_by_length
        self.train_collate = train_collate
        super().__init__(*args, **kwargs)

    def get_train_dataloader(self) -> Any:
        import datasets
        from torch.utils.data import DataLoader

        args, dataset = self.args, self.train_dataset
        if dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        if isinstance(dataset, datasets.Dataset):
            dataset = self._remove_unused_columns(dataset, description="training")
        n = len(dataset)
        seed = args.data_seed if args.data_seed is not None else args.seed
        info = self.shard_info
        info.update(examples=n, epoch_examples=examples_on_every_rank(self, n))
        packed = self.train_collate
        # Packed rows are all seq_len wide: nothing to group.
        lengths = example_lengths(dataset) if self.group_by_length and packed is None else None
        info["group_by_length"] = lengths is not None
        micro = self._train_batch_size
        sampler: Any
        if (bins := info.get("length_bins")) is not None:  # a packed plan trained padded by length (length_bins.py)
            # example_lengths: a conversation's tokens, a pair's longer side (both pad to it: sequences_per_example).
            sampler = LengthBinSampler(example_lengths(dataset), bins["bin_tokens"], bins["bins_per_step"], micro,
                                       seed, sequences=bins["sequences_per_example"])
            sampler.n_steps = examples_on_every_rank(self, len(sampler.steps))  # every rank the same steps
            info["group_by_length"] = True
        else:
            sampler = ShardBatchSampler(n, info["epoch_examples"], micro, seed, args.dataloader_drop_last,
                                        lengths=lengths, step=micro * args.gradient_accumulation_steps)
        loader = DataLoader(dataset, batch_sampler=sampler,
                            collate_fn=CountingCollator(packed or self.data_collator, info),
                            num_workers=args.dataloader_num_workers, pin_memory=args.dataloader_pin_memory,
                            persistent_workers=args.dataloader_persistent_workers and args.dataloader_num_workers > 0,
                            prefetch_factor=args.dataloader_prefetch_factor)
        return single_process_loader(self, loader)


def shard_report(trainer: Any) -> dict[str, Any] | None:
    """What this worker read and trained on: rank, row range, examples, examples per epoch (padded), and the
    examples it trained on in this attempt (a resumed attempt does not count the batches it skipped); None for a
    trainer that does not train on a shard."""
    info = getattr(trainer, "shard_info", None)  # ShardLoader's or PromptShardLoader's
    return dict(info) if info is not None else None
