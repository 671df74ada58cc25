"""The pipeline on Ray: data -> plan -> which stages run -> waves of StageJobs -> manifest -> summary.

Each unit has its module: the data (cleaning, preparation, fingerprints) run/stage_data.py, the stage graph,
waves and fingerprints run/dag.py (pure), planning run/planning.py, a stage's plan -> place -> run with back-off
run/job.py (shared with Tune sweeps), a wave's threads and progress run/wave.py, the summary run/outcomes.py
(docs/ARCHITECTURE.md)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from medgpt_ray import models
from medgpt_ray.config import STAGE_KINDS, ConfigError, OnlineRLStageConfig, PipelineConfig, resolved_dict, stage_kind
from medgpt_ray.data import prepare
from medgpt_ray.memory.stage_plan import StagePlan
from medgpt_ray.metrics import set_stage_state
from medgpt_ray.report.rundata import PREPARED_FILE, prepared_counts
from medgpt_ray.run import dag, pair_report
from medgpt_ray.run.job import StageJob
from medgpt_ray.run.manifest import Manifest, provenance, write_json_atomic
from medgpt_ray.run.outcomes import RunSummary, StageOutcome
from medgpt_ray.run.planning import plan_before_data, plan_by_lengths
from medgpt_ray.run.preflight import check_cpus, check_gpus
from medgpt_ray.run.ray_env import echo
from medgpt_ray.run.stage_data import RunData
from medgpt_ray.run.upstream import PipelineError, check_reward_adapter, finished_output
from medgpt_ray.run.wave import WaveRunner, progress_channel
from medgpt_ray.stages.inputs import StageInputs

__all__ = ["Pipeline", "RunOptions", "StageOutcome"]


@dataclass
class RunOptions:
    from_stage: str | None = None
    only_stage: str | None = None
    echo: Any = echo


@dataclass(frozen=True)
class Selection:
    """Which stages this run considers (`order`), reruns whatever the manifest says (`forced`) and runs."""

    order: list[str]
    forced: set[str]
    to_run: list[str]
    fingerprints: dict[str, str]


def _run_dir(cfg: PipelineConfig, connected_to: str) -> Path:
    out = Path(cfg.output_dir)
    if not out.is_absolute() and connected_to == "cluster" and len(ray.nodes()) > 1:
        raise ConfigError(
            f"output_dir: '{cfg.output_dir}' is relative, but this job runs on a {len(ray.nodes())}-node cluster; "
            f"set an absolute path on storage every node sees (NFS), e.g. --set output_dir=/mnt/shared/runs"
        )
    return (out / cfg.name).resolve()


class Pipeline:
    def __init__(self, cfg: PipelineConfig, options: RunOptions | None = None, connected_to: str = "local"):
        self.cfg = cfg
        self.opt = options or RunOptions()
        self.echo = self.opt.echo
        self.run_dir = _run_dir(cfg, connected_to)
        self.manifest = Manifest(self.run_dir / "manifest.json")
        self.storage_path = cfg.resources.storage_path or str(self.run_dir / "_ray")
        self.data = RunData(cfg, self.run_dir / "clean", self.run_dir / "data", self.echo)
        self.summary = RunSummary(cfg, self.run_dir, self.manifest, self.echo)
        # Set on Ctrl-C: a stage thread that then fails (its actors go down with the driver) is not a failure.
        self._interrupted = threading.Event()
        for s in (self.opt.from_stage, self.opt.only_stage):
            if s is not None and s not in STAGE_KINDS:
                raise ConfigError(f"stage '{s}' is not one of {', '.join(STAGE_KINDS)}")
            if s is not None and not cfg.runs(s):
                raise ConfigError(f"stage '{s}' is disabled in the config (stages.{s}.enabled: false)"
                                  if not cfg.passes_on(s) else f"stage '{s}' trains nothing (stages.{s}.max_steps: 0)")

    # ---- data -----------------------------------------------------------------------------
    def _prepare_data(self, any_stage_runs: bool = True) -> dict[str, prepare.PreparedData]:
        """The splits of every data kind (none when no stage runs), then the preference baselines on them."""
        prepared = self.data.prepare(self.data.kinds() if any_stage_runs else [])
        if prepared:  # a run with every stage skipped keeps the counts the run before it wrote
            write_json_atomic(self.run_dir / "data" / PREPARED_FILE, prepared_counts(prepared), mode=0o600)
        self.summary.baselines = pair_report.run_baselines(self.cfg, self.run_dir / "data", prepared)
        return prepared

    def _data_fingerprint(self, kind: str) -> str:
        return self.data.fingerprint(kind)

    # ---- which stages run -----------------------------------------------------------------
    def _select(self, plans: dict[str, StagePlan], base_config: dict[str, Any], prov: dict[str, Any]) -> Selection:
        """The stages to run and every enabled stage's fingerprint; the stages that do not run said so. The
        fingerprints hash the data sources' bytes: the train/held-out files are prepared only if a stage runs."""
        enabled = self.cfg.enabled_stages()
        kinds = {k for s in enabled for k in (stage_kind(s).data_kind, *stage_kind(s).reads)}
        data_fps = {kind: self._data_fingerprint(kind) for kind in kinds}
        fingerprints = dag.stage_fingerprints(self.cfg, plans, data_fps, base_config, prov)
        forced = self._forced_stages(enabled)
        order = [self.opt.only_stage] if self.opt.only_stage else enabled
        for s in self.cfg.stages.kinds():
            if self.cfg.passes_on(s):
                up = self.cfg.start_of(s)
                self.echo(f"[{s:>3}] max_steps 0: no training; its input, "
                          f"{f'the {up} model' if up else 'the base model'}, is passed on to the stages after it")
        to_run = dag.stages_to_run(self.cfg, order, forced, lambda s: self.manifest.is_done(s, fingerprints[s]))
        for s in order:
            set_stage_state(self.cfg.name, s, "pending" if s in to_run else "skipped")
            if s not in to_run:
                self.echo(f"[{s:>3}] done in manifest (fingerprint {fingerprints[s][:12]}), skipping")
        return Selection(order, forced, to_run, fingerprints)

    def _forced_stages(self, order: list[str]) -> set[str]:
        return dag.forced_stages(self.cfg, order, self.opt.from_stage, self.opt.only_stage)

    def _waves(self, stages: list[str]) -> list[list[str]]:
        return dag.waves(self.cfg, stages)

    def _check_reward_adapters(self, to_run: list[str], base_path: Path) -> None:
        """A stage about to run on the reward adapter of an rm finished in an earlier run: that adapter is there
        and fits this stage's base (an rm that reruns now writes its own; its `from` then reruns too)."""
        if any(stage_kind(s).produces_reward_model for s in to_run):
            return
        for s in to_run:
            c = self.cfg.stages.get(s)
            if isinstance(c, OnlineRLStageConfig) and c.reward_shared_base is True:
                check_reward_adapter(self.cfg, self.manifest, s, self._upstream_model(s, base_path))

    # ---- running --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        base_path, base_config, prov = self._start()
        plans, budget = plan_before_data(self.cfg)
        self.data.clean_raw(prov)
        sel = self._select(plans, base_config, prov)
        self._check_reward_adapters(sel.to_run, base_path)
        prepared = self._prepare_data(bool(sel.to_run))
        plans = plan_by_lengths(self.cfg, plans, budget, base_path, sel.to_run, prepared, self.echo)
        outcomes = self._run_waves(sel, plans, base_path, prepared, t0)
        summary = self.summary.write(self.summary.final(outcomes), time.monotonic() - t0)
        failed = [o for o in outcomes.values() if o.status == "failed"]
        if failed:
            raise PipelineError(f"stage {failed[0].stage} failed: {failed[0].error} "
                                f"(re-run the same command to resume; run dir {self.run_dir})")
        return summary

    def _start(self) -> tuple[Path, dict[str, Any], dict[str, Any]]:
        """The run directory with the resolved config, the manifest's run info, the cluster checked against the
        config; the base model's path and config, and the code's provenance."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.run_dir / "config.resolved.json", resolved_dict(self.cfg))
        base_path = models.resolve_model_path(self.cfg.model.path)
        base_config = models.model_config_dict(base_path)
        prov = provenance()
        self.manifest.set_run_info({"config": resolved_dict(self.cfg), "base_model_path": str(base_path), **prov})
        resources = ray.cluster_resources()  # a joined cluster's, known only now
        check_cpus(self.cfg, resources.get("CPU", 0), "the Ray cluster")
        check_gpus(self.cfg, resources.get("GPU", 0), "the Ray cluster")
        return base_path, base_config, prov

    def _run_waves(self, sel: Selection, plans: dict[str, StagePlan], base_path: Path,
                   prepared: dict[str, prepare.PreparedData], t0: float) -> dict[str, StageOutcome]:
        """Each wave's stages that run, until one fails; summary.json after every wave (a stage about to retrain
        is "pending": its old model may be replaced; one cut by Ctrl-C "interrupted")."""
        outcomes: dict[str, StageOutcome] = {}
        self.summary.write(self.summary.with_pending(outcomes, sel.to_run), time.monotonic() - t0, quiet=True)
        with progress_channel(self.cfg, self.echo) as progress:
            runner = WaveRunner(self.cfg, self.manifest, self.storage_path, progress, self.echo, self._interrupted)
            try:
                for wave in self._waves([s for s in self.cfg.enabled_stages() if s in sel.order]):
                    outcomes.update({s: StageOutcome(s, "skipped", self.manifest.entry(s) or {})
                                     for s in wave if s not in sel.to_run})
                    runnable = [s for s in wave if s in sel.to_run]
                    if not runnable:
                        continue
                    inputs = {s: self._inputs(s, plans[s], sel.fingerprints[s], base_path, prepared, s in sel.forced)
                              for s in runnable}
                    jobs = {s: self._job(s) for s in runnable}
                    outcomes.update(runner.run(jobs, inputs, sel.fingerprints))
                    self.summary.write(self.summary.with_pending(outcomes, sel.to_run), time.monotonic() - t0,
                                       quiet=True)
                    if any(o.status == "failed" for o in outcomes.values()):
                        break
            except KeyboardInterrupt:
                self._interrupted.set()
                self.summary.write(self.summary.with_pending(outcomes, sel.to_run, "interrupted"),
                                   time.monotonic() - t0, quiet=True)
                raise
        return outcomes

    def _job(self, stage: str) -> StageJob:
        return StageJob(self.cfg, stage, self.run_dir / stage, self.echo)

    def _upstream_model(self, stage: str, base_path: Path) -> Path:
        up = dag.effective_from(self.cfg, stage)
        return base_path if up is None else Path(finished_output(self.manifest, up, stage, "starts from"))

    def _inputs(self, stage: str, plan: StagePlan, fingerprint: str, base_path: Path,
                prepared: dict[str, prepare.PreparedData], forced: bool) -> StageInputs:
        """The stage's inputs for an attempt under `fingerprint`: a new attempt forgets the stage's manifest entry
        (its outputs are removed); an interrupted one resumes at its back-offs (StageJob.enter)."""
        job = self._job(stage)
        if forced or not job.same_attempt(fingerprint):
            self.manifest.forget(stage)
        plan = job.enter(plan, fingerprint, fresh=forced)
        needs = {n: finished_output(self.manifest, n, stage, "needs") for n in self.cfg.stages.get(stage).needs}
        reads = {k: [prepared[k].train_file, prepared[k].eval_file] for k in stage_kind(stage).reads if k in prepared}
        return job.inputs(plan, str(self._upstream_model(stage, base_path)), prepared[stage_kind(stage).data_kind],
                          needs, reads)
