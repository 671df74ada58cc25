"""Reward model: TRL RewardTrainer (Bradley–Terry on chosen vs rejected), held-out pairwise accuracy.

With `packing` on (the default where the model's attention allows it) the train split's pairs are packed into rows
of 2 x seq_len tokens and trained padding-free (stages/reward_packing.py); evaluation stays unpacked. A packed plan
whose worker's model cannot pack trains TRL's padded pairs by length instead, bins of a packed row's tokens
(stages/packing.py, trainer_kit/length_bins.py: the shard loader's sampler).

Trained with LoRA, it also keeps its adapter and score head beside the merged model (reward_adapter/,
stages/reward_adapter.py) for an online-RL stage that shares the base (reward_shared_base)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from medgpt_ray import models
from medgpt_ray.config import overlong_policy
from medgpt_ray.kinds.rm.config import RMStageConfig
from medgpt_ray.stages import packing, reward_packing
from medgpt_ray.stages.callbacks import stage_callbacks
from medgpt_ray.stages.inputs import BuiltStage, Sink, StageInputs
from medgpt_ray.stages.outputs import finish_stage
from medgpt_ray.stages.pair_rows import encode_pairs
from medgpt_ray.stages.reward_adapter import REWARD_ADAPTER
from medgpt_ray.stages.score_head import fp32_score_head
from medgpt_ray.stages.stage_data import open_stage_data
from medgpt_ray.stages.trainer_args import bucket_kwargs, group_by_length, training_kwargs
from medgpt_ray.trainer_kit.compose import trainer_class
from medgpt_ray.trainer_kit.packed_counts import PackedCounts
from medgpt_ray.trainer_kit.sharding import ShardLoader


def center_rewards_coefficient(inp: StageInputs) -> float | None:
    """rm's own key; a config of the base class (a stage built by hand, without the key) leaves it unset."""
    return inp.cfg.center_rewards_coefficient if isinstance(inp.cfg, RMStageConfig) else None


# rm packs whole pairs into rows of 2 x seq_len tokens (stages/reward_packing.py).
PAIRS = packing.PackedKind("pairs", encode_pairs, reward_packing.pack_pairs, reward_packing.row_width,
                           reward_packing.PairRowsCollator)


def build(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> BuiltStage:
    from trl import RewardConfig, RewardTrainer

    from medgpt_ray.stages.reward_trainer import PackedRewardTrainer

    data = open_stage_data(inp)
    tok, shard = data.tokenizer, data.shard
    pad_id = tok.pad_token_id  # read before the encoding thread starts: the load then never touches the tokenizer
    model, (train_ds, skipped, eval_ds) = data.encoded_while(
        lambda: models.load_reward_model(Path(inp.model_path), inp.plan.precision, inp.plan.method, pad_id),
        encode_pairs, inp.cfg.seq_len, overlong_policy(inp.cfg))
    # The score head and the pairwise loss on its scores in fp32 under bf16 (stages/score_head.py: a bf16 margin
    # rounds to 0); PEFT's trainable copy of the head (modules_to_save) is a copy of this one, fp32 too.
    fp32_score_head(model)
    train_inp, train_ds, collator, packed = packing.pack_train_split(inp, model, tok, data.template, train_ds, shard,
                                                                      PAIRS, sink)
    peft_config = models.lora_config(inp.cfg.lora, "SEQ_CLS", model) if inp.plan.method != "full" else None
    kwargs = training_kwargs(train_inp)
    if collator is not None:
        kwargs["include_num_input_tokens_seen"] = "no"  # PackedCounts counts the rows' real tokens instead
    args = RewardConfig(**kwargs, max_length=None, dataset_num_proc=None,
                        center_rewards_coefficient=center_rewards_coefficient(inp),
                        **bucket_kwargs(inp))
    # Packed: TRL's RewardTrainer on pair rows, counting each micro-batch's real tokens and pairs.
    rows = {"packed_unit": "pairs"} if collator is not None else {}
    cls = (trainer_class(PackedRewardTrainer, PackedCounts, ShardLoader) if collator is not None
           else trainer_class(RewardTrainer, ShardLoader))
    trainer = cls(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tok,
        peft_config=peft_config,
        callbacks=stage_callbacks(train_inp, sink, callbacks),
        shard=shard,
        group_by_length=group_by_length(inp),
        train_collate=collator,
        **rows,
    )
    return BuiltStage(trainer, tok, lora=peft_config is not None, eval_size=len(eval_ds) if eval_ds else 0,
                      extras={"train_pairs": packed.get("pairs", len(train_ds)),
                              "skipped_too_long": skipped["too_long"],
                              "skipped_tools_unsupported": skipped["tools_unsupported"], "packing": packed,
                              "overlong": skipped["overlong"],
                              # LoRA: the adapter and score head an RL stage on the same base scores with
                              **({"reward_adapter": str(inp.out / REWARD_ADAPTER)} if peft_config else {})},
                      save_kwargs={"seq_cls": True})


def run(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    t0 = time.monotonic()
    built = build(inp, sink, callbacks)
    return finish_stage(inp, built, t0, lambda ev: {
        "eval_loss": ev["eval_loss"], "eval_accuracy": ev["eval_accuracy"], "eval_margin": ev.get("eval_margin"),
        "eval_pairs": built.eval_size})
