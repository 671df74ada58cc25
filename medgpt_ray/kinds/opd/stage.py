"""On-policy distillation (MedicalGPT's training/opd_training.py): TRL's GKDTrainer (trl.experimental.gkd) on SFT
conversations, its loss on TRL's chunked divergence over both models' hidden states and heads cut to the tokenizer
(trainer_kit/chunked_jsd.py: no [tokens x vocabulary] logits of either model). The student is the model this stage
starts from (trained: LoRA, QLoRA or full, as planned); the teacher (an earlier stage's output or a model directory)
is loaded frozen beside it in every worker, in bf16 (fp32 on CPU) or NF4 (teacher_quantization 4bit, QLoRA's
loader). Held-out: the generalized JSD at `beta`, per answer token,
on the reference answers (eval_jsd), before and after training."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from medgpt_ray import models, templates
from medgpt_ray.config import overlong_policy
from medgpt_ray.kinds.opd.data import PromptAnswerCollator, encode_prompt_answer
from medgpt_ray.stages import speed
from medgpt_ray.stages.callbacks import stage_callbacks
from medgpt_ray.stages.inputs import BuiltStage, Sink, StageInputs
from medgpt_ray.stages.outputs import finish_stage
from medgpt_ray.stages.stage_data import open_stage_data
from medgpt_ray.stages.trainer_args import training_kwargs
from medgpt_ray.trainer_kit.cached_rollouts import CachedRollouts
from medgpt_ray.trainer_kit.checkpointing import FractionAtEveryForward
from medgpt_ray.trainer_kit.chunked_jsd import ChunkedJSD, add_hidden_state_output, heads_cut_for_trl
from medgpt_ray.trainer_kit.compose import trainer_class
from medgpt_ray.trainer_kit.merged_rollouts import MergedStudentSamples, merging_behaviour
from medgpt_ray.trainer_kit.sharding import ShardLoader
from medgpt_ray.trainer_kit.static_rollouts import StaticStudentSamples, static_decoding


def load_teacher(inp: StageInputs):
    """The frozen teacher: bf16 on GPU (fp32 where the plan computes in fp32), or NF4 through QLoRA's loader. A
    teacher directory must tokenize as the student does (the driver checked it too; this worker's copy may differ)."""
    import torch

    cfg = inp.cfg
    path = Path(cfg.teacher_path(inp.needs))
    if not (path / "config.json").is_file():
        raise ValueError(f"opd: teacher '{cfg.teacher}' is not a model directory here (no config.json in {path})")
    if not cfg.teacher_is_stage and (why := models.vocabulary_difference(Path(inp.model_path), path)) is not None:
        raise ValueError(f"opd: teacher {path} does not share the student's tokenizer ({inp.model_path}): {why}")
    if cfg.teacher_quantization == "4bit" and not torch.cuda.is_available():
        raise ValueError("opd: teacher_quantization '4bit' needs a CUDA GPU (bitsandbytes NF4); this process has "
                         "none: use 'none' on CPU")
    precision = "fp32" if inp.plan.precision == "fp32" else "bf16"
    teacher = models.load_causal_lm(path, precision, "qlora" if cfg.teacher_quantization == "4bit" else "full")
    teacher.requires_grad_(False)
    return teacher.eval()


def stop_ids(tok, template) -> list[int]:
    """EOS and the first token of the template's end of turn (chatml's <|im_end|>): where the student's answer ends."""
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    suffix = templates.resolved_suffix(template, tok).strip()
    if suffix:
        ids.add(tok(suffix, add_special_tokens=False)["input_ids"][0])
    return sorted(ids)


def build(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> BuiltStage:
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    cfg = inp.cfg
    data = open_stage_data(inp)
    tok, template = data.tokenizer, data.template
    train_ds, skipped, eval_ds = data.encoded(encode_prompt_answer, cfg.seq_len, cfg.max_new_tokens,
                                              overlong_policy(cfg))
    model = models.load_causal_lm(Path(inp.model_path), inp.plan.precision, inp.plan.method)
    model.generation_config.eos_token_id = stop_ids(tok, template)  # GKDTrainer samples until one of these
    add_hidden_state_output(model)  # before PEFT wraps it: ChunkedJSD's forward without logits
    peft_config = models.lora_config(cfg.lora, "CAUSAL_LM", model) if inp.plan.method != "full" else None
    args = GKDConfig(**training_kwargs(inp), max_length=None, packing=False, dataset_num_proc=None,
                     lmbda=cfg.lmbda, beta=cfg.beta, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                     prediction_loss_only=True)
    # Not peft's bf16 input cast: the student also generates outside the Trainer's autocast (as GRPO does).
    kept = [c for c in stage_callbacks(inp, sink, callbacks) if not isinstance(c, speed.Bf16LoraInputs)]
    # CachedRollouts: the student samples with the KV cache, which GKDTrainer turns off under checkpointing.
    merged = merging_behaviour(inp.plan.rollout, MergedStudentSamples)
    static = static_decoding(inp.plan, cfg)  # as grpo's
    teacher = load_teacher(inp)
    with heads_cut_for_trl(teacher, model, len(tok), inp.plan.zero_stage == 3):
        trainer = trainer_class(GKDTrainer, ChunkedJSD, CachedRollouts, ShardLoader, FractionAtEveryForward,
                                *merged, *((StaticStudentSamples,) if static else ()))(
            model=model, teacher_model=teacher, args=args, data_collator=PromptAnswerCollator(tok.pad_token_id),
            train_dataset=train_ds, eval_dataset=eval_ds, processing_class=tok, peft_config=peft_config,
            callbacks=kept, shard=data.shard, **(static or {}))
    trainer.vocab_size = len(tok)  # both heads cut to it (a 7B teacher's has 152,064 rows, a 1.5B student's 151,936)
    return BuiltStage(trainer, tok, lora=peft_config is not None, eval_size=len(eval_ds) if eval_ds else 0,
                      extras={"train_records": len(train_ds), "skipped_prompt_too_long": skipped["prompt_too_long"],
                              "overlong": skipped["overlong"],
                              "skipped_tools_unsupported": skipped["tools_unsupported"],
                              "teacher": cfg.teacher, "teacher_quantization": cfg.teacher_quantization},
                      save_kwargs={"template": template})


def run(inp: StageInputs, sink: Sink | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    t0 = time.monotonic()
    built = build(inp, sink, callbacks)
    before = built.trainer.evaluate()["eval_loss"] if built.eval_size else None
    return finish_stage(inp, built, t0, lambda ev: {"eval_jsd": ev["eval_loss"], "eval_jsd_before": before})
