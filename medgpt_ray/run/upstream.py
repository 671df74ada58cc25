"""What a stage reads from the stages before it: their finished outputs, from the manifest."""

from __future__ import annotations

from pathlib import Path

from medgpt_ray.config import OnlineRLStageConfig, PipelineConfig, reward_model_kind
from medgpt_ray.run import dag
from medgpt_ray.run.manifest import Manifest
from medgpt_ray.stages.reward_adapter import reward_adapter_for


class PipelineError(RuntimeError):
    pass


def finished_output(manifest: Manifest, up: str, stage: str, how: str) -> str:
    """The output model of finished stage `up`, which `stage` starts from or needs (`how`)."""
    entry = manifest.entry(up)
    if not entry or not Path(entry.get("output_model", "")).is_dir():
        raise PipelineError(
            f"stage {stage} {how} the output of stage {up}, which is not finished in "
            f"{manifest.path}; run the pipeline without --only-stage first"
        )
    return entry["output_model"]


def check_only_stage(cfg: PipelineConfig, stage: str) -> None:
    """`--only-stage S` reruns S alone: what it starts from and needs must be finished. Read from the manifest
    before Ray starts, so a user learns it in a second."""
    manifest = Manifest((Path(cfg.output_dir) / cfg.name / "manifest.json").resolve())
    up = dag.effective_from(cfg, stage)
    start = finished_output(manifest, up, stage, "starts from") if up is not None else None
    for need in cfg.stages.get(stage).needs:
        finished_output(manifest, need, stage, "needs")
    # From the base model the pipeline checks it: it resolves model.path, which may build the tiny preset.
    if start is not None:
        check_reward_adapter(cfg, manifest, stage, Path(start))


def check_reward_adapter(cfg: PipelineConfig, manifest: Manifest, stage: str, policy_base: Path) -> None:
    """An online-RL stage that scores with the rm's LoRA adapter on its own base (reward_shared_base) reads the
    finished rm's reward_adapter/, trained on `policy_base`. Checked on the driver before the stage is scheduled:
    on its worker the same error came only after Ray Train had started (an rm output from before reward adapters
    were kept has none)."""
    c, rm = cfg.stages.get(stage), reward_model_kind()
    if not isinstance(c, OnlineRLStageConfig) or c.reward_shared_base is not True or rm not in c.needs:
        return
    try:
        reward_adapter_for(finished_output(manifest, rm, stage, "needs"), str(policy_base), stage)
    except ValueError as err:
        raise PipelineError(str(err)) from err
