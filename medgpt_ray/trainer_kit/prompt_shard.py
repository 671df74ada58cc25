"""The online-RL trainers' (GRPO's, RLOO's) loader over its worker's shard of prompt records (trainer_kit/sharding.py's
rule: a worker trains on its shard as it is), in TRL's RepeatSampler order: a generation batch of prompts, each repeated
`num_generations` times in a row, the whole batch repeated for every micro-batch it feeds (TRL generates once and
serves the slices). Every worker's groups are whole, so TRL's gathered rewards fall into contiguous groups. The
epoch's prompt order is epoch_order's (seed, epoch) permutation, padded to the largest shard's prompt count."""

from __future__ import annotations

from typing import Any

from medgpt_ray.trainer_kit.shard_sampler import epoch_order, examples_on_every_rank
from medgpt_ray.trainer_kit.sharding import single_process_loader


class PromptGroupSampler:
    """Indices of one epoch: batches of `prompts` prompts, each index `generations` times, each batch `repeats`
    times; a partial last batch is dropped (a group needs its whole batch)."""

    def __init__(self, n: int, length: int, prompts: int, generations: int, repeats: int, seed: int):
        self.n, self.length, self.prompts, self.generations, self.repeats, self.seed = (
            n, length, prompts, generations, repeats, seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = epoch_order(self.n, self.length, self.seed, self.epoch)
        for start in range(0, len(order) - len(order) % self.prompts, self.prompts):
            chunk = order[start:start + self.prompts]
            for _ in range(self.repeats):
                for index in chunk:
                    yield from [index] * self.generations

    def __len__(self) -> int:
        return (self.length // self.prompts) * self.prompts * self.generations * self.repeats


class PromptShardLoader:
    """A GRPO or RLOO trainer sampling from its worker's shard of prompts. Constructor keyword: `shard`, what
    read_train_shard said (the loader adds its counts)."""

    def __init__(self, *args: Any, shard: dict[str, Any], **kwargs: Any):
        self.shard_info = shard
        super().__init__(*args, **kwargs)

    def get_train_dataloader(self) -> Any:
        """The train DataLoader over this worker's prompts, prepared by accelerate for a single process."""
        from torch.utils.data import DataLoader

        args, dataset = self.args, self.train_dataset
        n = len(dataset)
        info = self.shard_info
        info.update(examples=n, epoch_examples=examples_on_every_rank(self, n))
        per_call = self._train_batch_size * args.steps_per_generation  # completions per generate call, this worker
        if per_call % self.num_generations:
            raise ValueError(f"{type(self).__name__}: a worker's generation batch of {per_call} completions does "
                             f"not hold whole groups of num_generations {self.num_generations}")
        prompts = per_call // self.num_generations
        if info["epoch_examples"] < prompts:
            raise ValueError(f"{type(self).__name__}: {info['epoch_examples']} prompts per worker, fewer than the "
                             f"{prompts} one generation batch takes (effective_batch / num_generations / workers)")
        seed = args.data_seed if args.data_seed is not None else args.seed
        sampler = PromptGroupSampler(n, info["epoch_examples"], prompts, self.num_generations,
                                     self.num_iterations * args.steps_per_generation, seed)
        loader = DataLoader(dataset, batch_size=per_call, sampler=sampler, collate_fn=self.data_collator,
                            num_workers=args.dataloader_num_workers, pin_memory=args.dataloader_pin_memory)
        return single_process_loader(self, loader)
