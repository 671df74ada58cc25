"""The opd kind's memory model (its MEMORY, memory/kind_memory.py): sft's training pass of the student on padded rows
(ACTIVATION_SCALE), beside it the frozen teacher and the student's own answers.

  resident   the teacher's weights, at its own shape (its config.json; a stage teacher has the run's base shape):
             bf16 (fp32 on CPU), or NF4 with teacher_quantization 4bit, as QLoRA's loader holds them
  training   on top of the student's saved activations, the teacher's last hidden state and the larger of two
             moments that follow each other: the teacher's no-grad forward (one layer's working set: no logits,
             trainer_kit/chunked_jsd.py), then the chunked divergence (TRL's ChunkedDivergenceFunction): two fp32
             [tokens x VOCAB_TILE] tiles of at most TOKEN_TILE tokens, the answer tokens' hidden states of both
             models, and in backward the student's hidden-state gradient in fp32 (a frozen LoRA head gets none).
             `teacher_forward` is what the forward's working set exceeds the divergence's by (0 where it does not)
  generation the student's answers, one generate call per micro-batch of max_new_tokens: memory/generation.py's
             generation phase (KV cache, sampling logits, prefill) with one completion per prompt

Before the chunked loss, TRL's GKDTrainer.generalized_jsd_loss held ~62 B per logit of both models' full logits (the
H200, random-init Qwen2.5-1.5B student with LoRA r8, bf16, seq_len 1024: 12.15 GiB per sequence of the micro-batch,
bench/results/opd_memory_1.5b_h200_uncapped.json); that term is gone. The tiles' terms below are counted from TRL's
code, not yet measured on a GPU. Under ZeRO-3 both heads are partitioned and the stage keeps GKDTrainer's own loss
(trainer_kit/chunked_jsd.py), priced as measured: the teacher's logits and JSD_ELEMENTS_PER_LOGIT a logit."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from medgpt_ray.config import ConfigError
from medgpt_ray.kinds.opd.config import OPDStageConfig
from medgpt_ray.memory.kind_memory import KindMemory, KindTerms, MemoryProfile, PlannedSetup
from medgpt_ray.memory.shapes import NF4_BYTES_PER_PARAM, ModelShape, ShapeError, load_shape

# trl/kernels/chunked_divergence.py's TOKEN_CHUNK_SIZE and VOCAB_CHUNK_SIZE (tests/unit/test_opd_kind.py checks them):
# the fp32 tiles each of its passes projects a chunk of tokens into, for the student and the teacher.
TOKEN_TILE, VOCAB_TILE = 4096, 32768
JSD_ELEMENTS_PER_LOGIT = 32  # GKDTrainer's own loss, measured ~31 (above): the ZeRO-3 path
# The student's per-token activations against sft's model at equal tokens. GKD's rows are padded, not packed; TRL's
# other trainers on padded rows keep ~12 % less (kinds/dpo/memory.py). On the H100 (1.5B student with LoRA, mb 8 of
# 1,024-token rows, every micro-batch that wide: bench/results/opd_peaks_h100/) the run's peak needs ~0.8, and the
# 7B NF4 teacher's run (opd_7b_nf4_teacher_h100/) at least ~0.83: 0.88 stays above both.
ACTIVATION_SCALE = 0.88


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
    forward = e * tokens * (4 * t.hidden + 3 * t.mlp_width)  # the teacher's no-grad forward: one layer's working set
    if s.zero == 3:  # GKDTrainer's own loss over both models' full logits (ChunkedJSD steps aside under ZeRO-3)
        training = {"teacher_logits": e * tokens * t.vocab, "teacher_forward": forward,
                    "distillation_loss": JSD_ELEMENTS_PER_LOGIT * e * tokens * shape.vocab}
    else:
        tiles = 2 * 4 * min(tokens, TOKEN_TILE) * VOCAB_TILE  # student's and teacher's fp32 tile, forward or backward
        # The answer tokens' hidden states gathered for the loss (both models), the per-token fp32 statistics, and the
        # student's fp32 hidden-state gradient in backward. Planned as if every token were an answer token.
        gathered = tokens * (e * (shape.hidden + t.hidden) + 4 * 12 + 4 * shape.hidden)
        training = {"teacher_hidden": e * tokens * t.hidden, "teacher_forward": max(0.0, forward - tiles - gathered),
                    "distillation_loss": tiles + gathered}
    return KindTerms(resident={"teacher_weights": teacher_weight_bytes(t, quantization, s.precision)},
                     training=training)


def hints(cfg: OPDStageConfig, s: Any) -> list[tuple[str, dict[str, Any]]]:
    """Shorter student answers (the generation phase shrinks; the training rows stay seq_len wide), and a teacher in
    NF4 where it is in bf16 on a GPU."""
    out = [(f"max_new_tokens {c}", {"completion_len": c}) for c in (s.completion_len // 2, s.completion_len // 4)
           if c >= 16]
    if cfg.teacher_quantization != "4bit" and s.precision != "fp32":
        out.append(("teacher_quantization 4bit", {"kind_terms": partial(teacher_terms, teacher_shape(cfg), "4bit")}))
    return out


MEMORY = KindMemory(MemoryProfile("opd", activation_scale=ACTIVATION_SCALE, chunked_head=True),
                    setup_fields=setup_fields, hints=hints)
