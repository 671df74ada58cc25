"""Continued pretraining: HF Trainer on block-packed plain text."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from medgpt_ray import models
from medgpt_ray.stages.callbacks import stage_callbacks
from medgpt_ray.stages.inputs import BuiltStage, Sink, StageInputs
from medgpt_ray.stages.outputs import finish_stage, quiet_libraries
from medgpt_ray.stages.trainer_args import training_kwargs
from medgpt_ray.trainer_kit.compose import trainer_class
from medgpt_ray.trainer_kit.sharding import ShardLoader, read_eval, read_train_shard


def pack_blocks(texts: list[str], tokenizer, block_size: int) -> list[list[int]]:
    """Concatenate texts (each closed by EOS so documents don't bleed into each other) and cut
    fixed-size blocks; a corpus shorter than one block still gives one (shorter) block."""
    ids: list[int] = []
    for t in texts:
        ids.extend(tokenizer.encode(t, add_special_tokens=False))
        ids.append(tokenizer.eos_token_id)
    if len(ids) < block_size:
        return [ids] if ids else []
    return [ids[i : i + block_size] for i in range(0, len(ids) - block_size + 1, block_size)]


def _dataset(blocks: list[list[int]]):
    from datasets import Dataset

    return Dataset.from_dict({"input_ids": blocks, "attention_mask": [[1] * len(b) for b in blocks],
                              "labels": blocks})


def build(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> BuiltStage:
    from transformers import Trainer, TrainingArguments, default_data_collator

    quiet_libraries()
    model_path = Path(inp.model_path)
    tok = models.load_tokenizer(model_path)
    records, shard = read_train_shard(inp.train_file)  # this worker's shard, packed on its own
    train_blocks = pack_blocks([r["text"] for r in records], tok, inp.cfg.seq_len)
    eval_blocks = pack_blocks([r["text"] for r in read_eval(inp.eval_file)], tok, inp.cfg.seq_len)
    if not train_blocks:
        raise ValueError(f"pt: no training text in rows {shard['rows']} of {inp.train_file}")

    model = models.load_causal_lm(model_path, inp.plan.precision, inp.plan.method)
    peft_config = models.lora_config(inp.cfg.lora, "CAUSAL_LM", model) if inp.plan.method != "full" else None
    if peft_config is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft_config)

    trainer = trainer_class(Trainer, ShardLoader)(
        model=model,
        args=TrainingArguments(**training_kwargs(inp)),
        train_dataset=_dataset(train_blocks),
        eval_dataset=_dataset(eval_blocks) if eval_blocks else None,
        data_collator=default_data_collator,
        callbacks=stage_callbacks(inp, sink, callbacks),
        shard=shard,
    )
    return BuiltStage(trainer, tok, lora=peft_config is not None, eval_size=len(eval_blocks),
                      extras={"train_blocks": len(train_blocks)})


def run(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    t0 = time.monotonic()
    return finish_stage(inp, build(inp, sink, callbacks), t0, lambda ev: {
        "eval_loss": ev["eval_loss"], "eval_perplexity": math.exp(min(ev["eval_loss"], 50))})
