"""What every conversation stage (sft, rm, dpo) reads before it encodes: the tokenizer checked against the chat
template, this worker's shard of the train split, and the held-out split."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from medgpt_ray import models, templates
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.stages.outputs import quiet_libraries
from medgpt_ray.trainer_kit.sharding import read_eval, read_train_shard

Model = TypeVar("Model")


@dataclass
class StageData:
    tokenizer: Any
    template: Any
    records: list[dict]  # this worker's shard of the train split
    shard: dict[str, Any]  # which shard (trainer_kit/sharding.py)
    eval_records: list[dict]  # the whole held-out split

    def encoded(self, encode: Callable[..., tuple[Any, Any]], *args: Any) -> tuple[Any, Any, Any]:
        """(train dataset, what `encode` counted as skipped, held-out dataset or None) of `encode(records,
        tokenizer, template, *args)`."""
        train, skipped = encode(self.records, self.tokenizer, self.template, *args)
        held_out = encode(self.eval_records, self.tokenizer, self.template, *args)[0] if self.eval_records else None
        return train, skipped, held_out

    def encoded_while(self, load: Callable[[], Model], encode: Callable[..., tuple[Any, Any]],
                      *args: Any) -> tuple[Model, tuple[Any, Any, Any]]:
        """(`load()`, `encoded(encode, *args)`), the encoding on a thread beside the load: the two overlap where
        they wait outside the GIL (the weights read and copied to the device; the tokenizer's Rust encoder), and a
        stage's first step comes sooner by the shorter of the two (issue 48). The model loads on this thread, the one
        the worker's GPU is bound to (torch's current device is per thread); nothing else uses the tokenizer
        meanwhile."""
        pool = ThreadPoolExecutor(1, thread_name_prefix="encode")
        future = pool.submit(self.encoded, encode, *args)
        try:
            model = load()
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # the load's error is the stage's; the encoding is moot
            raise
        try:
            return model, future.result()
        finally:
            pool.shutdown()


def open_stage_data(inp: StageInputs) -> StageData:
    """Also seeds torch with the run's seed: what a stage creates before its Trainer seeds (the reward model's new
    score head, TRL's LoRA adapters) is then the same in every run of the same config."""
    from transformers import set_seed

    quiet_libraries()
    set_seed(inp.seed)
    tok = models.load_tokenizer(Path(inp.model_path))
    template = templates.get_template(inp.template)
    templates.check_template(template, tok)
    records, shard = read_train_shard(inp.train_file)
    return StageData(tok, template, records, shard, read_eval(inp.eval_file))
