"""SimPO: TRL's CPOTrainer (trl.experimental.cpo) with loss_type "simpo": the chosen answer's length-normalised
log-probability must beat the rejected one's by a margin (gamma), with no reference model; `cpo_alpha` > 0 adds the
chosen answer's NLL (CPO-SimPO). Held-out accuracy is TRL's: chosen ranked first by that normalised reward. Its
concatenated forward runs on TRL's chunked LM head (trainer_kit/fused_preference.py: no full logits)."""

from __future__ import annotations

import os
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
from medgpt_ray.stages.trainer_args import bucket_kwargs, training_kwargs
from medgpt_ray.trainer_kit.compose import trainer_class
from medgpt_ray.trainer_kit.fused_preference import FusedCPO, add_fused_head
from medgpt_ray.trainer_kit.pair_tokens import PairTokenCount
from medgpt_ray.trainer_kit.sharding import ShardLoader


def build(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> BuiltStage:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # chosen knowingly: TRL 1.16 keeps CPO there
    from trl.experimental.cpo import CPOConfig, CPOTrainer

    cfg = inp.cfg
    data = open_stage_data(inp)
    tok, template, shard = data.tokenizer, data.template, data.shard
    model, (train_ds, skipped, eval_ds) = data.encoded_while(
        lambda: models.load_causal_lm(Path(inp.model_path), inp.plan.precision, inp.plan.method),
        preference_texts, inp.cfg.seq_len, overlong_policy(inp.cfg))
    peft_config = models.lora_config(cfg.lora, "CAUSAL_LM", model) if inp.plan.method != "full" else None
    lora = peft_config is not None
    add_fused_head(model)  # before PEFT wraps it: the concatenated forward's log-probabilities without logits
    model, peft_config = models.lora_without_kbit_prep(model, peft_config, inp.seed)  # QLoRA: no fp32 upcast
    kwargs = {**training_kwargs(inp), "include_num_input_tokens_seen": "no"}  # PairTokenCount counts
    args = CPOConfig(**kwargs, loss_type="simpo", beta=cfg.beta, simpo_gamma=cfg.gamma,
                     cpo_alpha=cfg.cpo_alpha, max_length=cfg.seq_len, dataset_num_proc=None)
    trainer = trainer_class(CPOTrainer, FusedCPO, PairTokenCount, ShardLoader)(
        model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds, processing_class=tok,
        peft_config=peft_config, callbacks=stage_callbacks(inp, sink, callbacks), shard=shard,
        group_by_length=cfg.group_by_length)
    trainer.pad_to_multiple_of = bucket_kwargs(inp)["pad_to_multiple_of"]  # a few lengths for compiled layers
    return built_pairs(trainer, tok, lora, train_ds, eval_ds, skipped, template)


def run(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    return run_pairs(build, inp, sink, callbacks)
