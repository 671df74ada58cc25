"""DPO: TRL DPOTrainer. With LoRA the reference is the adapter-disabled policy (no second copy)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from medgpt_ray import models, templates
from medgpt_ray.config import overlong_policy
from medgpt_ray.stages.callbacks import stage_callbacks
from medgpt_ray.stages.inputs import BuiltStage, Sink, StageInputs
from medgpt_ray.stages.overlong import LengthTally, pair_outcome
from medgpt_ray.stages.pair_results import built_pairs, run_pairs
from medgpt_ray.stages.stage_data import open_stage_data
from medgpt_ray.stages.trainer_args import bucket_kwargs, group_by_length, training_kwargs
from medgpt_ray.trainer_kit.compose import trainer_class
from medgpt_ray.trainer_kit.sharding import ShardLoader


def rendered_prompts(records: list[dict], tokenizer, template) -> tuple[list[str], list[dict], list[int], int]:
    """(prompts, the records they belong to, each prompt's tokens, how many records were left out for tools the
    template cannot render): each record's prompt turns rendered by our template."""
    prompts, kept, tools_unsupported = [], [], 0
    for r in records:
        try:
            prompts.append(templates.render_prompt(template, tokenizer, r["conversations"], tools=r.get("tools")))
        except templates.TemplateToolsUnsupported:
            tools_unsupported += 1
            continue
        kept.append(r)
    return prompts, kept, token_counts(tokenizer, prompts), tools_unsupported


def token_counts(tokenizer, texts: list[str]) -> list[int]:
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []


def fitted_examples(records: list[dict], tokenizer, template, seq_len: int | None, policy: str, unit: str,
                    responses: tuple[str, ...], carried: tuple[str, ...] = ()
                    ) -> tuple[dict[str, list], dict[str, Any]]:
    """Rows of the prompt and each field of `responses` closed by the template's end-of-turn token, with the
    examples longer than seq_len (prompt + longest response) cut or skipped by `policy` (stages/overlong.py's rule:
    the trainers keep the prompt and cut the responses' tails), and the fields of `carried` as they are; ValueError
    naming `unit` when none is left."""
    prompts, kept, prompt_lens, tools_unsupported = rendered_prompts(records, tokenizer, template)
    texts = {k: [templates.response_text(template, tokenizer, r[k]) for r in kept] for k in responses}
    longest = [max(n) for n in zip(*(token_counts(tokenizer, t) for t in texts.values()), strict=True)] if kept else []
    tally = LengthTally(seq_len if seq_len is not None else sys.maxsize, policy, unit, "pairs")
    rows: dict[str, list] = {"prompt": [], **{k: [] for k in responses + carried}}
    for i, prompt in enumerate(prompts):
        outcome = pair_outcome(prompt_lens[i], longest[i], tally.seq_len, policy)
        tally.add(prompt_lens[i] + longest[i], outcome)
        if outcome != "skipped":  # TRL would train it on an empty answer: no target, or a NaN loss under ORPO/CPO
            rows["prompt"].append(prompt)
            for k in responses:
                rows[k].append(texts[k][i])
            for k in carried:
                rows[k].append(kept[i][k])
    if records and not rows["prompt"]:
        raise ValueError(f"none of the {len(records)} {unit} can be trained: {tools_unsupported} have tools template "
                         f"{template.name!r} cannot render, {tally.skipped} do not fit seq_len {seq_len}")
    return rows, {"too_long": tally.skipped, "tools_unsupported": tools_unsupported, "overlong": tally}


def preference_texts(records: list[dict], tokenizer, template, seq_len: int | None = None, policy: str = "truncate"):
    """Prompt rendered by our template (with the record's tools); responses closed by the template's end-of-turn
    token, which TRL then sees as already ending with EOS when the tokenizer's EOS is that token. Left out and
    counted: pairs with tools when the template has no tool format, and pairs longer than seq_len by `policy`.
    Returns (dataset, {"tools_unsupported": n, "too_long": n, "overlong": LengthTally})."""
    from datasets import Dataset

    rows, skipped = fitted_examples(records, tokenizer, template, seq_len, policy, "pairs", ("chosen", "rejected"))
    return Dataset.from_dict(rows), skipped


def build(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> BuiltStage:
    from trl import DPOConfig, DPOTrainer

    data = open_stage_data(inp)
    tok, template, shard = data.tokenizer, data.template, data.shard
    model_path = Path(inp.model_path)
    if inp.cfg.precompute_ref_log_probs and shard["shards"] > 1:
        # TRL precomputes over the train set as if every rank held all of it (it splits it across ranks again and
        # shares rank 0's cache file): with a shard per worker that would pair pairs with other pairs' log-probs.
        raise ValueError("dpo: precompute_ref_log_probs needs num_workers: 1 (each worker trains on its own shard)")
    train_ds, skipped, eval_ds = data.encoded(preference_texts, inp.cfg.seq_len, overlong_policy(inp.cfg))

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
