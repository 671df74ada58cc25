"""KTO: TRL's KTOTrainer on unpaired examples (data.unpaired's, and data.preference's pairs unpaired: chosen desirable,
rejected undesirable), from the SFT model; the reference is the adapter-off policy (LoRA) or a frozen copy (full),
as DPO's. The kto loss measures each example against a KL reference point estimated from mismatched prompt-
completion pairs: TRL gives every example the completion of its neighbour in the shard (rotated within runs of
micro-batch size) and refuses a micro-batch of 1 (the config and the planner keep it at 2 or more). The shard's
sampler shuffles and groups by length (trainer_kit/shard_sampler.py), so a micro-batch's KL completions are a random
set of other examples' rather than its own: the same estimate of the reference point in expectation. The shard is
read in an order of its own (a hash of each record), so a pair's two halves, next to each other in the split, are
not each other's KL completion.

Held-out accuracy: the share of held-out pairs whose chosen answer has the higher implicit reward
beta * log pi/pi_ref (stages/implicit_reward.py); TRL's own eval loss and reward means are logged too."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from medgpt_ray import models
from medgpt_ray.config import overlong_policy
from medgpt_ray.stages.callbacks import stage_callbacks
from medgpt_ray.stages.implicit_reward import held_out_pairs, pair_accuracy
from medgpt_ray.stages.inputs import BuiltStage, Sink, StageInputs
from medgpt_ray.stages.pair_results import run_pairs
from medgpt_ray.stages.preference_rows import fitted_examples, preference_texts
from medgpt_ray.stages.stage_data import open_stage_data
from medgpt_ray.stages.trainer_args import bucket_kwargs, training_kwargs
from medgpt_ray.trainer_kit.compose import trainer_class
from medgpt_ray.trainer_kit.sharding import ShardLoader


def unpaired_texts(records: list[dict], tokenizer, template, seq_len: int | None = None, policy: str = "truncate"):
    """TRL's unpaired rows {"prompt", "completion", "label"}: prompts rendered as preference_texts renders them,
    completions closed by the template's end-of-turn token, examples longer than seq_len cut or skipped by `policy`
    as pairs are. Returns (dataset, {"tools_unsupported", "too_long", "overlong"})."""
    from datasets import Dataset

    labelled = [{**r, "label": bool(r["label"])} for r in records]
    rows, skipped = fitted_examples(labelled, tokenizer, template, seq_len, policy, "examples", ("completion",),
                                    ("label",))
    return Dataset.from_dict(rows), skipped


def _shuffled(records: list[dict]) -> list[dict]:
    """The shard in an order fixed by each record's content: a pair's halves are no longer neighbours."""
    def key(r: dict) -> str:
        return hashlib.sha256(json.dumps(r, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return sorted(records, key=key)


def build(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> BuiltStage:
    from trl import KTOConfig, KTOTrainer

    cfg = inp.cfg
    data = open_stage_data(inp)
    tok, template, shard = data.tokenizer, data.template, data.shard
    data.records = _shuffled(data.records)
    train_ds, skipped, eval_ds = data.encoded(unpaired_texts, cfg.seq_len, overlong_policy(cfg))
    pairs = held_out_pairs(data.eval_records)
    pair_ds = preference_texts(pairs, tok, template, cfg.seq_len)[0] if pairs else None
    model_path = Path(inp.model_path)
    model = models.load_causal_lm(model_path, inp.plan.precision, inp.plan.method)
    peft_config = models.lora_config(cfg.lora, "CAUSAL_LM", model) if inp.plan.method != "full" else None
    # Full-parameter KTO: an explicit frozen copy as reference (FIELD-NOTES, as DPO); LoRA: the adapter-off policy.
    ref_model = models.load_causal_lm(model_path, inp.plan.precision, "full") if peft_config is None else None
    # "sequential": TRL's check for the kto loss's KL pairing; the shard's own sampler orders the steps (above).
    args = KTOConfig(**training_kwargs(inp), beta=cfg.beta, loss_type=cfg.loss_type,
                     desirable_weight=cfg.desirable_weight, undesirable_weight=cfg.undesirable_weight,
                     max_length=cfg.seq_len, dataset_num_proc=None, train_sampling_strategy="sequential",
                     **bucket_kwargs(inp))
    trainer = trainer_class(KTOTrainer, ShardLoader)(
        model=model, ref_model=ref_model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
        processing_class=tok, peft_config=peft_config, callbacks=stage_callbacks(inp, sink, callbacks),
        shard=shard, group_by_length=cfg.group_by_length)
    desirable = sum(train_ds["label"])
    return BuiltStage(trainer, tok, lora=peft_config is not None, eval_size=len(eval_ds) if eval_ds else 0,
                      extras={"train_examples": len(train_ds), "train_desirable": desirable,
                              "train_undesirable": len(train_ds) - desirable,
                              "skipped_tools_unsupported": skipped["tools_unsupported"],
                              "skipped_too_long": skipped["too_long"], "overlong": skipped["overlong"]},
                      save_kwargs={"template": template}, held_out=pair_ds)


def _held_out(built: BuiltStage) -> dict[str, Any]:
    trainer = built.trainer
    return pair_accuracy(trainer, built.held_out, trainer.args.per_device_eval_batch_size)


def run(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    return run_pairs(build, inp, sink, callbacks, held_out=_held_out)
