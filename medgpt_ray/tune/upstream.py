"""What a sweep's trials start from and read: with `--from-run RUN`, the outputs a finished pipeline run recorded
for the stages the swept one starts from (`from`) and `needs`, found with the pipeline's own helpers
(run/upstream.py, run/manifest.py, run/dag.py); without it, the config's model.path, as before. Pure: no Ray, no
model read, so a dry run checks it too."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medgpt_ray.config import ConfigError, PipelineConfig
from medgpt_ray.run import dag
from medgpt_ray.run.manifest import Manifest
from medgpt_ray.run.upstream import PipelineError, check_reward_adapter, finished_output

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class TrialStart:
    """The swept stage's start and needs, as every trial of the sweep takes them."""

    stage: str
    upstream: str | None  # the stage it starts from in the pipeline (dag.effective_from); None: the base model
    model: str | None  # that stage's output model in the run; None: the config's model.path
    needs: dict[str, str] = field(default_factory=dict)  # {stage: its output model in the run}
    run_dir: str | None = None  # --from-run's RUN

    def model_path(self, base: str) -> str:
        """The model the trials start from, `base` (the config's model.path, resolved) where the run gives none."""
        return self.model if self.model is not None else base

    def summary(self, base: str) -> dict[str, Any]:
        return {"starts_from": self.model_path(base), "needs": dict(self.needs)}

    def line(self, base_path: str) -> str | None:
        """What the driver says the trials start from; None where nothing is worth saying (the base model, no
        run)."""
        if self.run_dir is None:
            if self.upstream is None:
                return None
            # Silently training from the base model looked like a sweep of the pipeline's own stage: it is not.
            return (f"trials start from model.path {base_path} (stages.{self.stage} starts from {self.upstream} in "
                    f"the pipeline): --from-run RUN would start them from a finished run's {self.upstream}")
        how = f"starts from {self.upstream}" if self.upstream else "starts from the base model"
        needs = ", ".join(f"{k} -> {v}" for k, v in self.needs.items())
        return (f"trials start from {self.model or f'model.path {base_path}'} (stages.{self.stage} {how})"
                + (f", needs: {needs}" if needs else "") + f"; read from --from-run {self.run_dir}")


def trial_start(cfg: PipelineConfig, stage: str, run_dir: str | Path | None) -> TrialStart:
    """The trials' start model and needs for the swept `stage`: from the run `run_dir`'s manifest (ConfigError
    naming the run and the stage when it has not finished what the stage reads), or the base model without one."""
    up = dag.effective_from(cfg, stage)
    if run_dir is None:
        return TrialStart(stage, up, None)
    run = Path(run_dir)
    manifest = _manifest(run)
    model = _finished(manifest, run, up, stage, "starts from") if up is not None else None
    needs = {n: _finished(manifest, run, n, stage, "needs") for n in cfg.stages.get(stage).needs}
    if model is not None:
        try:  # an RL stage scoring with the rm's adapter on its own base: the run's rm must have been trained on it
            check_reward_adapter(cfg, manifest, stage, Path(model))
        except PipelineError as e:
            raise ConfigError(f"--from-run {run}: {e}") from None
    return TrialStart(stage, up, model, needs, str(run))


def _manifest(run: Path) -> Manifest:
    path = run / MANIFEST
    if not path.is_file():
        raise ConfigError(f"--from-run {run}: {path} not found: RUN is a finished pipeline run's directory "
                          f"(runs/<name>, which holds {MANIFEST})")
    try:
        return Manifest(path)
    # AttributeError: JSON that is not an object (Manifest sets its default stages on it).
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise ConfigError(f"--from-run {run}: {path} is not a readable manifest ({e})") from None


def _finished(manifest: Manifest, run: Path, up: str, stage: str, how: str) -> str:
    """`up`'s output model in the run, absolute: a trial's worker may not share the driver's working directory."""
    try:
        return str(Path(finished_output(manifest, up, stage, how)).resolve())
    except PipelineError:
        entry = manifest.entry(up)
        why = (f"{manifest.path} has no entry for it" if entry is None
               else f"its model directory {entry.get('output_model') or '(none recorded)'} is missing")
        raise ConfigError(f"--from-run {run}: stages.{stage} {how} the output of stage {up}, which that run has not "
                          f"finished ({why}): finish {up} there first (medgpt-ray run), or give a run where it "
                          f"finished") from None
