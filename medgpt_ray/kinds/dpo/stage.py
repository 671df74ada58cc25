"""DPO: TRL DPOTrainer. With LoRA the reference is the adapter-disabled policy (no second copy)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from medgpt_ray import models, templates
from medgpt_ray.stages.callbacks import stage_callbacks
from medgpt_ray.stages.inputs import BuiltStage, Sink, StageInputs
from medgpt_ray.stages.pair_results import built_pairs, run_pairs
from medgpt_ray.stages.stage_data import open_stage_data
from medgpt_ray.stages.trainer_args import bucket_kwargs, group_by_length, training_kwargs
from medgpt_ray.trainer_kit.compose import trainer_class
from medgpt_ray.trainer_kit.sharding import ShardLoader


def rendered_prompts(records: list[dict], tokenizer, template, seq_len: int | None,
                     what: str) -> tuple[list[str], list[dict], dict[str, int]]:
    """(prompts, the records they belong to, {"tools_unsupported": n, "too_long": n}): each record's prompt turns
    rendered by our template, records with tools the template cannot render or whose prompt alone fills seq_len
    left out and counted; ValueError naming `what` (pairs, examples) when none is left."""
    prompts, kept, skipped = [], [], {"tools_unsupported": 0, "too_long": 0}
    for r in records:
        try:
            prompt = templates.render_prompt(template, tokenizer, r["conversations"], tools=r.get("tools"))
        except templates.TemplateToolsUnsupported:
            skipped["tools_unsupported"] += 1
            continue
        if seq_len is not None and len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) >= seq_len:
            skipped["too_long"] += 1
            continue
        prompts.append(prompt)
        kept.append(r)
    if records and not kept:
        raise ValueError(f"none of the {len(records)} {what} can be trained: {skipped['tools_unsupported']} have "
                         f"tools template {template.name!r} cannot render, {skipped['too_long']} have a prompt "
                         f"that fills seq_len {seq_len}")
    return prompts, kept, skipped


def preference_texts(records: list[dict], tokenizer, template, seq_len: int | None = None):
    """Prompt rendered by our template (with the record's tools); responses closed by the template's end-of-turn
    token, which TRL then sees as already ending with EOS when the tokenizer's EOS is that token. Left out and
    counted: pairs with tools when the template has no tool format, and pairs whose prompt alone fills seq_len
    (TRL would train them on an empty answer: no target, or a NaN loss under ORPO and CPO).
    Returns (dataset, {"tools_unsupported": n, "too_long": n})."""
    from datasets import Dataset

    prompts, kept, skipped = rendered_prompts(records, tokenizer, template, seq_len, "pairs")
    return Dataset.from_dict({
        "prompt": prompts,
        "chosen": [templates.response_text(template, tokenizer, r["chosen"]) for r in kept],
        "rejected": [templates.response_text(template, tokenizer, r["rejected"]) for r in kept],
    }), skipped


def build(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> BuiltStage:
    from trl import DPOConfig, DPOTrainer

    data = open_stage_data(inp)
    tok, template, shard = data.tokenizer, data.template, data.shard
    model_path = Path(inp.model_path)
    if inp.cfg.precompute_ref_log_probs and shard["shards"] > 1:
        # TRL precomputes over the train set as if every rank held all of it (it splits it across ranks again and
        # shares rank 0's cache file): with a shard per worker that would pair pairs with other pairs' log-probs.
        raise ValueError("dpo: precompute_ref_log_probs needs num_workers: 1 (each worker trains on its own shard)")
    train_ds, skipped, eval_ds = data.encoded(preference_texts, inp.cfg.seq_len)

    model = models.load_causal_lm(model_path, inp.plan.precision, inp.plan.method)
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
