"""DPO: TRL DPOTrainer. With LoRA the reference is the adapter-disabled policy (no second copy)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from medgpt_ray import models
from medgpt_ray.config import overlong_policy
from medgpt_ray.stages.callbacks import stage_callbacks
from medgpt_ray.stages.inputs import BuiltStage, Sink, StageInputs
from medgpt_ray.stages.pair_results import built_pairs, run_pairs
from medgpt_ray.stages.preference_rows import preference_texts
from medgpt_ray.stages.stage_data import open_stage_data
from medgpt_ray.stages.trainer_args import bucket_kwargs, group_by_length, training_kwargs
from medgpt_ray.trainer_kit.compose import trainer_class
from medgpt_ray.trainer_kit.sharding import ShardLoader


def build(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> BuiltStage:
    from trl import DPOConfig, DPOTrainer

    data = open_stage_data(inp)
    tok, template, shard = data.tokenizer, data.template, data.shard
    model_path = Path(inp.model_path)
    if inp.cfg.precompute_ref_log_probs and shard["shards"] > 1:
        # TRL precomputes over the train set as if every rank held all of it (it splits it across ranks again and
        # shares rank 0's cache file): with a shard per worker that would pair pairs with other pairs' log-probs.
        raise ValueError("dpo: precompute_ref_log_probs needs num_workers: 1 (each worker trains on its own shard)")
    model, (train_ds, skipped, eval_ds) = data.encoded_while(
        lambda: models.load_causal_lm(model_path, inp.plan.precision, inp.plan.method),
        preference_texts, inp.cfg.seq_len, overlong_policy(inp.cfg))
    peft_config = models.lora_config(inp.cfg.lora, "CAUSAL_LM", model) if inp.plan.method != "full" else None
    # Full-parameter DPO needs an explicit frozen copy as reference (FIELD-NOTES); LoRA does not.
    ref_model = models.load_causal_lm(model_path, inp.plan.precision, "full") if peft_config is None else None
    cfg = inp.cfg
    args = DPOConfig(**training_kwargs(inp), beta=cfg.beta, loss_type=cfg.losses, loss_weights=cfg.loss_weights,
                     label_smoothing=cfg.label_smoothing, discopop_tau=cfg.discopop_tau,
                     max_length=inp.cfg.seq_len, dataset_num_proc=None,
                     precompute_ref_log_probs=inp.cfg.precompute_ref_log_probs, **bucket_kwargs(inp))
    trainer = trainer_class(DPOTrainer, ShardLoader)(
        model=model,
        ref_model=ref_model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tok,
        peft_config=peft_config,
        callbacks=stage_callbacks(inp, sink, callbacks),
        shard=shard,
        group_by_length=group_by_length(inp),
    )
    return built_pairs(trainer, tok, peft_config is not None, train_ds, eval_ds, skipped, template)


def run(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    return run_pairs(build, inp, sink, callbacks)
