"""What a stage reads from the stages before it: their finished outputs, from the manifest."""

from __future__ import annotations

from pathlib import Path

from medgpt_ray.config import PipelineConfig
from medgpt_ray.run import dag
from medgpt_ray.run.manifest import Manifest


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
    if up is not None:
        finished_output(manifest, up, stage, "starts from")
    for need in cfg.stages.get(stage).needs:
        finished_output(manifest, need, stage, "needs")
