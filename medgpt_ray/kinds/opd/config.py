"""The opd kind's config (on-policy distillation, MedicalGPT's training/opd_training.py): TRL's GKDTrainer on SFT
conversations (data.sft), the student the model this stage trains, the teacher a frozen model beside it. Sits with
config/ (docs/ARCHITECTURE.md, "The stage-kind contract"); registered here, imported by config/__init__."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from medgpt_ray.config.base import Auto
from medgpt_ray.config.online_rl import GenerationPath
from medgpt_ray.config.registry import STAGE_KINDS, StageKind, register_stage_kind
from medgpt_ray.config.stage import OverlongStageConfig


class OPDStageConfig(OverlongStageConfig):
    """On-policy distillation: in a share `lmbda` of the micro-batches the student answers the conversation's
    prompt itself (sampled at `temperature`, up to `max_new_tokens`), else the record's reference answer is used;
    either way the loss is the generalized Jensen-Shannon divergence (at `beta`) between the student's and the frozen
    teacher's next-token distributions on the answer's tokens. The prompt is the conversation up to its last
    assistant turn; one whose prompt leaves fewer than max_new_tokens of seq_len keeps the prompt's end (`overlong:
    truncate`) or is left out (`skip`), counted either way."""

    teacher: Annotated[str, Field(min_length=1)] = "sft"
    """An earlier stage of this run by name (its output model; the stage is added to `needs`), or a local Hugging
    Face model directory with the student's vocabulary (written with a '/', e.g. ./models/teacher-7b). The teacher's
    identity is in the fingerprint: the stage's, or the directory's path and config.json."""
    teacher_quantization: Literal["none", "4bit"] = "none"
    """4bit: the teacher loaded in NF4 (QLoRA's loader, bitsandbytes; a GPU only); none: bf16 on GPU, fp32 on CPU."""
    lmbda: Annotated[float, Field(ge=0, le=1)] = 0.5
    """Share of micro-batches whose answers the student generates itself (on-policy); the rest use the reference
    answers. MedicalGPT's default 0.5."""
    beta: Annotated[float, Field(ge=0, le=1)] = 0.5
    """The generalized JSD's interpolation: 0 is KL(teacher || student), 1 the reverse KL, 0.5 the symmetric JSD."""
    temperature: Annotated[float, Field(gt=0)] = 0.9
    """Sampling temperature of the student's own answers (TRL's GKD default)."""
    max_new_tokens: Annotated[int, Field(ge=1)] = 128
    """Tokens the student generates per answer at most."""
    compile: Auto | bool = False
    """Compile each decoder layer in place. Off by default here: generation changes the input shape every token."""
    generation_path: GenerationPath = "auto"
    """How the student's samples decode: static, dynamic or auto, as grpo's `generation_path`."""

    @model_validator(mode="before")
    @classmethod
    def _teacher_stage_is_needed(cls, data: Any) -> Any:
        # A teacher that is a stage of the run is a dependency like any `needs`: the stage graph orders it first, its
        # output model is handed over in StageInputs.needs, and its fingerprint enters this stage's.
        if isinstance(data, dict):
            teacher = data.get("teacher", cls.model_fields["teacher"].default)
            needs = list(data.get("needs") or [])
            if teacher in STAGE_KINDS and teacher not in needs:
                data = {**data, "needs": [*needs, teacher]}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> OPDStageConfig:
        if not self.teacher_is_stage and "/" not in self.teacher and not Path(self.teacher).is_dir():
            raise ValueError(f"teacher: '{self.teacher}' is neither a stage ({', '.join(STAGE_KINDS)}) nor a model "
                             f"directory (write a path with a '/', e.g. ./{self.teacher})")
        if self.teacher == self.from_:
            raise ValueError(f"teacher: '{self.teacher}' is also the stage the student starts from (`from`): the "
                             f"student would start as the teacher")
        if self.max_new_tokens >= self.seq_len:
            raise ValueError(f"max_new_tokens: {self.max_new_tokens} leaves no room for the prompt in seq_len "
                             f"{self.seq_len}")
        return self

    @property
    def teacher_is_stage(self) -> bool:
        return self.teacher in STAGE_KINDS

    def teacher_path(self, needs: dict[str, str]) -> str:
        """The teacher's model directory: the stage's output (from StageInputs.needs), or the directory given."""
        return needs[self.teacher] if self.teacher_is_stage else str(Path(self.teacher).expanduser())

    def training_identity(self) -> dict[str, Any]:
        """The shared identity, and for a teacher directory its config.json's hash (a stage teacher's identity is
        its fingerprint, which enters this stage's as a `needs`)."""
        identity = super().training_identity()
        if not self.teacher_is_stage:
            config = Path(self.teacher).expanduser() / "config.json"
            identity["teacher_config"] = (hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file()
                                          else "missing")
        return identity


# Off unless enabled. The student starts from the base model unless `from` names a stage: distilling the sft stage
# into the model it started from is the default pairing (teacher: sft). Its own memory kind (kinds/opd/memory.py):
# sft's training pass on padded rows, the teacher and the student's generation.
register_stage_kind(StageKind("opd", OPDStageConfig, "sft", None, {"enabled": False, "lr": 1e-5},
                              module="medgpt_ray.kinds.opd.stage"))
