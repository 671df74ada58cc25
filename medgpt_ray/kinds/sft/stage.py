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

from medgpt_ray import models, templates
from medgpt_ray.config import overlong_policy
from medgpt_ray.stages import packing
from medgpt_ray.stages.callbacks import stage_callbacks
from medgpt_ray.stages.inputs import BuiltStage, Sink, StageInputs
from medgpt_ray.stages.outputs import finish_stage
from medgpt_ray.stages.overlong import LengthTally, conversation_cut
from medgpt_ray.stages.stage_data import open_stage_data
from medgpt_ray.stages.trainer_args import bucket_kwargs, group_by_length, training_kwargs
from medgpt_ray.trainer_kit.compose import trainer_class
from medgpt_ray.trainer_kit.packed_counts import PackedCounts
from medgpt_ray.trainer_kit.packed_rows import PackedCollator
from medgpt_ray.trainer_kit.sharding import ShardLoader
from medgpt_ray.trainer_kit.sync_free import SyncFreeLoss

ANSWERS = ("assistant", "tool_call")  # the trained turns, one trained span each


def encode_conversations(records: list[dict], tokenizer, template, seq_len: int, policy: str = "truncate"):
    """Tokenize with exact labels (assistant and tool_call turns trained, tool results not). A conversation longer
    than seq_len is cut at a turn boundary or skipped by `policy` (stages/overlong.py's rule), never trained on with
    no target; one with tools when the template has no tool format is skipped. Returns (dataset,
    {"too_long": n, "tools_unsupported": n, "overlong": LengthTally})."""
    from datasets import Dataset

    rows, tally, tools_unsupported = [], LengthTally(seq_len, policy, "conversations", "conversations"), 0
    for r in records:
        try:
            enc = templates.encode_sft(tokenizer, template, r["conversations"], tools=r.get("tools"))
        except templates.TemplateToolsUnsupported:
            tools_unsupported += 1
            continue
        n = len(enc["input_ids"])
        cut = n if n <= seq_len else None if policy == "skip" else conversation_cut(
            enc["labels"], seq_len, [t["role"] == "tool_call" for t in r["conversations"] if t["role"] in ANSWERS])
        tally.add(n, "kept" if cut == n else "skipped" if cut is None else "truncated")
        if cut is not None:
            rows.append({k: v[:cut] for k, v in enc.items()})
    if not rows:
        why = (f"template {template.name!r} has no tool format" if tools_unsupported else f"seq_len {seq_len}")
        raise ValueError(f"sft: none of the {len(records)} conversations can be trained ({why}; "
                         f"{tally.skipped} too long, {tools_unsupported} with tools)")
    return Dataset.from_dict({
        "input_ids": [r["input_ids"] for r in rows],
        "attention_mask": [r["attention_mask"] for r in rows],
        "labels": [r["labels"] for r in rows],
    }), {"too_long": tally.skipped, "tools_unsupported": tools_unsupported, "overlong": tally}


def build(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> BuiltStage:
    from trl import SFTConfig, SFTTrainer

    data = open_stage_data(inp)
    tok, template, shard = data.tokenizer, data.template, data.shard
    train_ds, skipped, eval_ds = data.encoded(encode_conversations, inp.cfg.seq_len, overlong_policy(inp.cfg))

    model = models.load_causal_lm(Path(inp.model_path), inp.plan.precision, inp.plan.method)
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
