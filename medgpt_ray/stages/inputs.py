"""What a stage is given (StageInputs) and what its builder hands back (BuiltStage)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medgpt_ray.config import PipelineConfig, StageConfig, stage_kind
from medgpt_ray.memory.stage_plan import StagePlan

Sink = Callable[[dict[str, Any]], None]


@dataclass
class StageInputs:
    stage: str
    cfg: StageConfig
    plan: StagePlan
    model_path: str  # the model this stage starts from (base, or the upstream stage's merged model)
    template: str
    train_file: str  # canonical records, Parquet in hash order; each worker reads its shard (trainer_kit/sharding.py)
    eval_file: str  # the held-out records, Parquet, read whole
    out_dir: str  # runs/<name>/<stage>
    seed: int = 42
    resume: bool = True
    needs: dict[str, str] = field(default_factory=dict)  # stage -> output model, for each stage it `needs`
    # The kind's module, resolved where the inputs are made: a Ray worker may not have a kind registered at run time
    # in the driver (config.STAGE_KINDS). None: looked up by `stage`.
    module: str | None = None
    report_to: str = "none"  # "tensorboard": rank 0 writes event files under out_dir/tb (stages/tensorboard.py)
    # Other data kinds the stage reads (its kind's `reads`, config/registry.py): kind -> [train file, held-out file]
    data_files: dict[str, list[str]] = field(default_factory=dict)
    # The `reward_model` reward when the reward model is held elsewhere (reward_model_gpu: run/reward_actor.py's
    # client of its actor); None: each worker loads the rm stage's model beside the policy.
    reward_scorer: Any = None

    @classmethod
    def of(cls, cfg: PipelineConfig, stage: str, plan: StagePlan, model_path: str, train_file: str, eval_file: str,
           out_dir: str, needs: dict[str, str] | None = None,
           data_files: dict[str, list[str]] | None = None) -> StageInputs:
        """A stage's inputs as the pipeline and a Tune trial give them: its config, template and the run's seed."""
        return cls(stage, cfg.stages.get(stage), plan, model_path, cfg.template_for(stage), train_file, eval_file,
                   out_dir, seed=cfg.seed, needs=dict(needs or {}), module=stage_kind(stage).module_name,
                   report_to=cfg.report_to_for(stage), data_files=dict(data_files or {}))

    @property
    def out(self) -> Path:
        return Path(self.out_dir)

    @property
    def checkpoint_dir(self) -> Path:
        return self.out / "checkpoints"


@dataclass
class BuiltStage:
    """A stage's trainer, ready to train: what `run` goes on with and what the memory calibration measures."""

    trainer: Any
    tokenizer: Any
    lora: bool
    eval_size: int = 0  # held-out examples (0: no evaluation)
    extras: dict[str, Any] | None = None  # counts for the result (records, pairs, skipped)
    save_kwargs: dict[str, Any] | None = None  # template / seq_cls for save_outputs
    # What the stage scores itself after training (kto: its held-out pairs; grpo, rloo: the held-out prompts).
    held_out: Any = None
