"""The opd kind's memory terms (its MEMORY, memory/kind_memory.py; it follows sft's memory model): beside sft's
training pass of the student, the frozen teacher and the student's own answers.

  resident   the teacher's weights, at its own shape (its config.json; a stage teacher has the run's base shape):
             bf16 (fp32 on CPU), or NF4 with teacher_quantization 4bit, as QLoRA's loader holds them
  training   at backward start, on top of the student's saved activations: the teacher's no-grad forward (its logits,
             b x s x vocab, and one layer's working set) and the generalized JSD's full-vocabulary tensors (TRL's
             GKDTrainer computes both models' full logits: scaled logits, log-softmaxes, the mixture, two KLs)
  generation the student's answers, one generate call per micro-batch of max_new_tokens: memory/generation.py's
             generation phase (KV cache, sampling logits, prefill) with one completion per prompt

JSD_ELEMENTS_PER_LOGIT is measured: GKDTrainer.generalized_jsd_loss holds the scaled logits and log-softmaxes of both
models, the stacked pair, the mixture, two KLs, their sum and, in backward, their gradients. On the H200 (random-init
Qwen2.5-1.5B student with LoRA r8 and a frozen copy as teacher, bf16, reference answers filling seq_len 1024, no
checkpointing) the peak grew by 12.15 GiB per sequence of the micro-batch (18.14, 30.31, 54.58 GiB at 1, 2, 4:
bench/results/opd_memory_1.5b_h200_uncapped.json); less the student's activations and the teacher's terms, the loss
held ~62 B per logit, i.e. ~31 bf16 elements. 12 (a count of the forward's tensors alone) predicted 19.44 GiB for
micro-batch 2, which died at 23.3 GiB under a 24 GiB cap (bench/results/opd_memory_1.5b_h200_uncalibrated.json)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from medgpt_ray.config import ConfigError
from medgpt_ray.kinds.opd.config import OPDStageConfig
from medgpt_ray.memory.kind_memory import KindMemory, KindTerms, PlannedSetup
from medgpt_ray.memory.shapes import NF4_BYTES_PER_PARAM, ModelShape, ShapeError, load_shape

JSD_ELEMENTS_PER_LOGIT = 32  # measured ~31 (module docstring), a little above


def setup_fields(cfg: OPDStageConfig, use_gpu: bool) -> dict[str, Any]:
    """The TrainSetup fields opd decides: a generation phase of one answer per prompt every micro-batch (GKD
    generates in training_step), planned at seq_len (prompt + max_new_tokens fit in it: kinds/opd/data.py), and the
    teacher's terms."""
    if cfg.teacher_quantization == "4bit" and not use_gpu:
        raise ConfigError("stages.opd.teacher_quantization: '4bit' needs GPUs (bitsandbytes NF4, QLoRA's loader); "
                          "resources.use_gpu is false: use 'none' on CPU")
    return {"generations": 1, "completion_len": cfg.max_new_tokens, "gen_steps": 1, "seq_len": cfg.seq_len,
            "generation_path": cfg.generation_path, "generation_on_gpu": use_gpu,
            "kind_terms": partial(teacher_terms, teacher_shape(cfg), cfg.teacher_quantization)}


def teacher_shape(cfg: OPDStageConfig) -> ModelShape | None:
    """The teacher directory's architecture from its config.json; None: the run's base shape (a stage teacher, or a
    directory not readable where the plan is made)."""
    if cfg.teacher_is_stage or not (Path(cfg.teacher).expanduser() / "config.json").is_file():
        return None
    try:
        return load_shape(str(Path(cfg.teacher).expanduser()))
    except ShapeError as e:
        raise ConfigError(f"stages.opd.teacher: {e}") from None


def teacher_weight_bytes(shape: ModelShape, quantization: str, precision: str) -> float:
    if quantization == "4bit":
        return NF4_BYTES_PER_PARAM * shape.linear_params + 2 * (shape.params - shape.linear_params)
    return (4 if precision == "fp32" else 2) * shape.params


def teacher_terms(teacher: ModelShape | None, quantization: str, shape: ModelShape, s: PlannedSetup) -> KindTerms:
    t = teacher or shape
    e = 4 if s.precision == "fp32" else 2
    tokens = s.tokens()
    return KindTerms(
        resident={"teacher_weights": teacher_weight_bytes(t, quantization, s.precision)},
        training={"teacher_logits": e * tokens * t.vocab,
                  "teacher_forward": e * tokens * (4 * t.hidden + 3 * t.mlp_width),
                  "distillation_loss": JSD_ELEMENTS_PER_LOGIT * e * tokens * shape.vocab})


def hints(cfg: OPDStageConfig, s: Any) -> list[tuple[str, dict[str, Any]]]:
    """Shorter student answers (the generation phase shrinks; the training rows stay seq_len wide), and a teacher in
    NF4 where it is in bf16 on a GPU."""
    out = [(f"max_new_tokens {c}", {"completion_len": c}) for c in (s.completion_len // 2, s.completion_len // 4)
           if c >= 16]
    if cfg.teacher_quantization != "4bit" and s.precision != "fp32":
        out.append(("teacher_quantization 4bit", {"kind_terms": partial(teacher_terms, teacher_shape(cfg), "4bit")}))
    return out


MEMORY = KindMemory(setup_fields=setup_fields, hints=hints)
