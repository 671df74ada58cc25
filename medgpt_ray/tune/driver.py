"""The sweep driver: the config as the pipeline reads it (--set and --overrides), its data as the pipeline prepares
it (run/stage_data.py: cleaned `data.raw` included), what the trials start from (tune/upstream.py: a finished run's
outputs with --from-run), then a Tune trial per configuration, each a StageJob (tune/trial.py), and the results with
the best overrides (tune/results.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from medgpt_ray import models
from medgpt_ray.config import PipelineConfig, load_config, resolved_dict, stage_kind
from medgpt_ray.data.prepare import PreparedData
from medgpt_ray.memory.budget import resolve_budget
from medgpt_ray.run.manifest import provenance
from medgpt_ray.run.stage_data import RunData
from medgpt_ray.tune.dry_run import dry_run as plan_dry_run
from medgpt_ray.tune.dry_run import sample
from medgpt_ray.tune.results import summarise
from medgpt_ray.tune.slots import SlotPool, slot_releaser
from medgpt_ray.tune.sweep import SweepConfig, load_sweep, param_space, trial_gpu_groups
from medgpt_ray.tune.trial import TrialContext, trial
from medgpt_ray.tune.trial_lines import TrialLines
from medgpt_ray.tune.upstream import TrialStart, trial_start

__all__ = ["SlotPool", "run_sweep"]

# A fixed namespace: a restored sweep's callbacks (pickled with the experiment) find the new pool by name.
NAMESPACE = "medgpt-tune"


def run_sweep(config_path: str, sets: list[str], sweep_path: str, echo: Callable[[str], None] = print,
              dry_run: bool = False, resume: bool = False, overrides: str | None = None,
              from_run: str | None = None,
              before_ray: Callable[[PipelineConfig], None] | None = None) -> dict[str, Any]:
    """The sweep of `sweep_path` over the config (`sets` and the `overrides` file applied, as the pipeline does);
    `dry_run`: plan the trials only (no Ray, no data); `from_run`: a finished pipeline run whose outputs the trials
    start from and read (the swept stage's `from` and `needs`); `before_ray`: called with the config once the
    config, the sweep file and the run are checked, before anything needs Ray (the CLI connects there, so a
    mistake in any of them costs a second, not a cluster start)."""
    cfg = load_config(config_path, sets, overrides)
    sweep = load_sweep(sweep_path, cfg, from_run)
    start = trial_start(cfg, sweep.stage, from_run)
    if dry_run:
        budget = resolve_budget(cfg, None, 24.0)
        _announce(cfg, sweep, budget, start, echo)
        return {**plan_dry_run(sweep, resolved_dict(cfg), budget, echo), **start.summary(cfg.model.path)}
    if before_ray is not None:
        before_ray(cfg)
    from medgpt_ray.run.planning import run_budget

    budget = run_budget(cfg)
    _announce(cfg, sweep, budget, start, echo)
    out = (Path(cfg.output_dir) / f"{cfg.name}-tune-{sweep.stage}").resolve()
    data = sweep_data(cfg, stage_kind(sweep.stage).data_kind, out, echo)
    # Ray Train's and Tune's storage: resources.storage_path (shared by every node of a cluster), else the sweep's
    # own directory.
    storage_root = Path(cfg.resources.storage_path) / out.name if cfg.resources.storage_path else out
    groups, topology = _slot_groups(cfg, sweep.stage)
    pool_name = f"medgpt-tune-slots-{cfg.name}-{sweep.stage}"
    pool = SlotPool.options(name=pool_name, namespace=NAMESPACE, get_if_exists=True).remote(groups)
    from medgpt_ray.run.ray_env import worker_env

    ctx = TrialContext(resolved_dict(cfg), sweep.stage, sweep.metric, sweep.mode, budget, pool_name, NAMESPACE,
                       topology, str(out), start.model_path(str(models.resolve_model_path(cfg.model.path))), data,
                       worker_env(), str(storage_root / "train"), start.needs)
    concurrent = len(groups) if sweep.max_concurrent_trials == "auto" else min(len(groups),
                                                                                 sweep.max_concurrent_trials)
    tuner = _tuner(sweep, ctx, storage_root / "tune", concurrent, resume, echo)
    echo(f"{concurrent} trial(s) at a time; trials under {storage_root / 'tune' / 'sweep'}")
    # Some metrics exist only in a stage's last report (kto's pair accuracy, grpo's held-out accuracy reward), not
    # at its evaluations during training: Tune would refuse those reports. ASHA skips a report without the metric;
    # a metric no trial reports at all is an error in summarise, with what the stage does report.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    grid = tuner.fit()
    ray.kill(pool)
    return summarise(grid, sweep, out, echo, start.summary(ctx.model_path))


def _announce(cfg: PipelineConfig, sweep: SweepConfig, budget, start: TrialStart,
              echo: Callable[[str], None]) -> None:
    trials = len(sample(sweep, 0)) if sweep.searcher == "grid" else sweep.num_samples
    echo(f"sweep of stage {sweep.stage}: {trials} trial(s), {sweep.searcher} search, metric {sweep.metric} "
         f"({sweep.mode}); budget {budget.describe()}")
    if line := start.line(cfg.model.path):
        echo(line)


def sweep_data(cfg: PipelineConfig, kind: str, out: Path, echo: Callable[[str], None]) -> PreparedData:
    """The trials' train/held-out split of `kind`, from the paths the pipeline reads: `data.raw` cleaned first (into
    the sweep's own out/clean), PII-redacted as the pipeline's is (the opt-out said, the counts shown)."""
    data = RunData(cfg, out / "clean", out / "data", echo)
    data.clean_raw(provenance())
    return data.prepare([kind])[kind]


def _slot_groups(cfg: PipelineConfig, stage: str) -> tuple[list[list[int]], str | None]:
    """The GPU sets concurrent trials take turns on (and the topology file the trials load), or CPU slots."""
    workers = cfg.workers_for(stage)
    if cfg.resources.use_gpu:
        from medgpt_ray.run.gpu_placement import find_topology

        topo = find_topology(cfg)
        groups = trial_gpu_groups(topo, workers, cfg.stages.get(stage).placement)
        return groups, topo.source if Path(topo.source).is_file() else cfg.resources.topology_file
    slots = max(1, int(ray.cluster_resources().get("CPU", 1) // (workers * cfg.resources.cpus_per_worker)))
    return [[] for _ in range(slots)], None


def _tuner(sweep: SweepConfig, ctx: TrialContext, storage: Path, concurrent: int, resume: bool,
           echo: Callable[[str], None]):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    trainable = tune.with_resources(tune.with_parameters(trial, ctx=ctx), {"cpu": 0, "memory": 1})
    exp = storage / "sweep"
    if resume and tune.Tuner.can_restore(str(exp)):
        echo(f"resuming the sweep in {exp}: finished trials are not rerun")
        return tune.Tuner.restore(str(exp), trainable=trainable, resume_errored=True)
    search = None
    if sweep.searcher == "optuna":
        from optuna.samplers import TPESampler
        from ray.tune.search.optuna import OptunaSearch

        search = OptunaSearch(sampler=TPESampler(seed=sweep.seed))
    scheduler = ASHAScheduler(grace_period=sweep.grace_period) if sweep.scheduler == "asha" else None
    trials = len(sample(sweep, 0)) if sweep.searcher == "grid" else sweep.num_samples
    return tune.Tuner(
        trainable, param_space=param_space(sweep),
        tune_config=tune.TuneConfig(metric=sweep.metric, mode=sweep.mode, search_alg=search, scheduler=scheduler,
                                    num_samples=1 if sweep.searcher == "grid" else sweep.num_samples,
                                    max_concurrent_trials=concurrent),
        run_config=tune.RunConfig(name="sweep", storage_path=str(storage), verbose=0,
                                  callbacks=[slot_releaser(ctx.pool, ctx.namespace),
                                             TrialLines(echo, sweep.metric, trials)]))
