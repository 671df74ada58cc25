"""Supervised fine-tuning: TRL SFTTrainer on multi-turn conversations, response-only labels.

The conversations are tokenized by templates.encode_sft, so every assistant turn
(not only the last) is trained and the labels are exact by construction; TRL
receives `input_ids` + `labels` and leaves them as they are. With `packing` on
(the default where the model's attention allows it), the train split is packed
into rows of seq_len tokens first (stages/packing.py); evaluation stays unpacked.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from medgpt_ray import models
from medgpt_ray.config import overlong_policy
from medgpt_ray.stages import packing
from medgpt_ray.stages.callbacks import stage_callbacks
from medgpt_ray.stages.conversation_rows import encode_conversations
from medgpt_ray.stages.inputs import BuiltStage, Sink, StageInputs
from medgpt_ray.stages.outputs import finish_stage
from medgpt_ray.stages.stage_data import open_stage_data
from medgpt_ray.stages.trainer_args import bucket_kwargs, group_by_length, training_kwargs
from medgpt_ray.trainer_kit.compose import trainer_class
from medgpt_ray.trainer_kit.packed_attention import use_attention
from medgpt_ray.trainer_kit.packed_counts import PackedCounts
from medgpt_ray.trainer_kit.packed_rows import PackedCollator
from medgpt_ray.trainer_kit.sharding import ShardLoader
from medgpt_ray.trainer_kit.sync_free import SyncFreeLoss


def build(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> BuiltStage:
    from trl import SFTConfig, SFTTrainer

    data = open_stage_data(inp)
    tok, template, shard = data.tokenizer, data.template, data.shard
    model, (train_ds, skipped, eval_ds) = data.encoded_while(
        lambda: models.load_causal_lm(Path(inp.model_path), inp.plan.precision, inp.plan.method),
        encode_conversations, inp.cfg.seq_len, overlong_policy(inp.cfg))
    use_attention(model, inp.plan.attention)
    train_inp, train_ds, collator, packed = packing.pack_train_split(inp, model, tok, template, train_ds, shard,
                                                                      CONVERSATIONS, sink)
    peft_config = models.lora_config(inp.cfg.lora, "CAUSAL_LM", model) if inp.plan.method != "full" else None
    kwargs = training_kwargs(train_inp)
    if collator is not None:
        kwargs["include_num_input_tokens_seen"] = "no"  # PackedCounts counts the rows' real tokens instead
    # TRL's own packing stays off: it would flatten each micro-batch into one sequence (see trainer_kit/packed_rows.py).
    args = SFTConfig(**kwargs, max_length=None, packing=False, dataset_num_proc=None, **bucket_kwargs(inp))
    # Packed: PackedCounts first, it hands each micro-batch's real tokens to SyncFreeLoss's count.
    behaviours = (PackedCounts, SyncFreeLoss, ShardLoader) if collator is not None else (SyncFreeLoss, ShardLoader)
    trainer = trainer_class(SFTTrainer, *behaviours)(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tok,
        peft_config=peft_config,
        callbacks=stage_callbacks(train_inp, sink, callbacks),  # the plan trained: a refused packed plan's fallback
        shard=shard,
        group_by_length=group_by_length(inp),
        train_collate=collator,
    )
    return BuiltStage(trainer, tok, lora=peft_config is not None, eval_size=len(eval_ds) if eval_ds else 0,
                      extras={"train_records": packed.get("conversations", len(train_ds)),
                              "skipped_too_long": skipped["too_long"],
                              "skipped_tools_unsupported": skipped["tools_unsupported"], "packing": packed,
                              "overlong": skipped["overlong"]},
                      save_kwargs={"template": template})


# SFT packs conversations into rows of seq_len tokens (trainer_kit/packed_rows.py).
CONVERSATIONS = packing.PackedKind("conversations", encode_conversations, packing.pack, lambda seq_len: seq_len,
                                   PackedCollator)


def run(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    t0 = time.monotonic()
    return finish_stage(inp, build(inp, sink, callbacks), t0, lambda ev: {
        "eval_loss": ev["eval_loss"],
        **({"eval_token_accuracy": ev["eval_mean_token_accuracy"]} if "eval_mean_token_accuracy" in ev else {})})
