"""The online-RL trainers' (GRPO's, RLOO's) loader over its worker's shard of prompt records (stages/sharding.py's
rule: a worker trains on its shard as it is), in TRL's RepeatSampler order: a generation batch of prompts, each repeated
`num_generations` times in a row, the whole batch repeated for every micro-batch it feeds (TRL generates once and
serves the slices). Every worker's groups are whole, so TRL's gathered rewards fall into contiguous groups. The
epoch's prompt order is epoch_order's (seed, epoch) permutation, padded to the largest shard's prompt count."""

from __future__ import annotations

from typing import Any

from medgpt_ray.stages.sharding import epoch_order, examples_on_every_rank, swap_train_dataloader


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


def prompt_dataloader(trainer: Any) -> Any:
    """The train DataLoader over this worker's prompts, prepared by accelerate for a single process."""
    from accelerate.data_loader import prepare_data_loader
    from torch.utils.data import DataLoader

    args, dataset = trainer.args, trainer.train_dataset
    n = len(dataset)
    info = trainer.medgpt_shard
    info.update(examples=n, epoch_examples=examples_on_every_rank(trainer, n))
    per_call = trainer._train_batch_size * args.steps_per_generation  # completions per generate call, this worker
    if per_call % trainer.num_generations:
        raise ValueError(f"{type(trainer).__name__}: a worker's generation batch of {per_call} completions does not "
                         f"hold whole groups of num_generations {trainer.num_generations}")
    prompts = per_call // trainer.num_generations
    if info["epoch_examples"] < prompts:
        raise ValueError(f"{type(trainer).__name__}: {info['epoch_examples']} prompts per worker, fewer than the "
                         f"{prompts} one generation batch takes (effective_batch / num_generations / workers)")
    seed = args.data_seed if args.data_seed is not None else args.seed
    sampler = PromptGroupSampler(n, info["epoch_examples"], prompts, trainer.num_generations,
                                 trainer.num_iterations * args.steps_per_generation, seed)
    loader = DataLoader(dataset, batch_size=per_call, sampler=sampler, collate_fn=trainer.data_collator,
                        num_workers=args.dataloader_num_workers, pin_memory=args.dataloader_pin_memory)
    return prepare_data_loader(loader, device=trainer.accelerator.device, num_processes=1, process_index=0,
                               put_on_device=True, dispatch_batches=False, even_batches=False)


def install_prompt_shard(trainer: Any, shard: dict[str, Any]) -> None:
    """Make this GRPO or RLOO trainer sample from its worker's shard (its class swapped for a cached subclass)."""
    trainer.medgpt_shard = shard
    swap_train_dataloader(trainer, prompt_dataloader, "the prompts (stages/prompt_shard.py)")
