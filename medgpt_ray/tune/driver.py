"""The sweep driver: data once, a Tune trial per configuration (planned first), results, best overrides."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
import yaml

from medgpt_ray import models
from medgpt_ray.config import ConfigError, PipelineConfig, load_config, resolved_dict, stage_kind
from medgpt_ray.data.prepare import PreparedData, kind_paths, not_redacted_line, prepare_kind, prepared_line
from medgpt_ray.memory.planner import PlanError, model_shape, plan_stage, resolve_budget
from medgpt_ray.placement.policy import PlacementError, place_stage
from medgpt_ray.placement.topology import load_topology_file
from medgpt_ray.run.backoff import run_with_backoff
from medgpt_ray.run.stage_runner import RayOptions, run_stage_on_ray
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.tune.sweep import (
    PENALTY,
    format_table,
    load_sweep,
    override_lines,
    param_space,
    predicted_run_seconds,
    trial_config,
    trial_gpu_groups,
    wait_for_slot,
)
from medgpt_ray.tune.trial_lines import TrialLines


@ray.remote(num_cpus=0)
class SlotPool:
    """Disjoint GPU sets (or CPU slots) handed to concurrent trials, chosen together by the placement policy."""

    def __init__(self, groups: list[list[int]]):
        self.groups = groups
        self.free = list(range(len(groups)))
        self.owners: dict[str, int] = {}

    def acquire(self, owner: str = "") -> int | None:
        if not self.free:
            return None
        slot = self.free.pop(0)
        if owner:
            self.owners[owner] = slot
        return slot

    def release(self, slot: int) -> None:
        self.owners = {o: s for o, s in self.owners.items() if s != slot}
        if slot not in self.free:
            self.free.append(slot)
            self.free.sort()

    def release_owner(self, owner: str) -> None:
        if owner in self.owners:
            self.release(self.owners[owner])

    def group(self, slot: int) -> list[int]:
        return self.groups[slot]


def _trial(params: dict[str, Any], ctx: dict[str, Any]) -> None:
    """One trial: plan (prune if it cannot fit), take a slot, run the stage under Ray Train, give the slot back."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    stage, metric = ctx["stage"], ctx["metric"]
    worst = PENALTY if ctx["mode"] == "min" else -PENALTY
    try:
        cfg = trial_config(ctx["base"], stage, params)
        plan = plan_stage(stage, cfg.stages.get(stage), cfg.workers_for(stage), cfg.resources.use_gpu,
                          model_shape(cfg), ctx["budget"])
    except PlanError as e:
        # Never launched: no Ray Train worker exists for it. The searcher sees the worst value.
        tune.report({metric: worst, "pruned": 1, "predicted_peak_gib": e.smallest_peak_gib,
                     "reason": str(e).splitlines()[0][:300], "predicted_run_s": ctx["pruned_cost"](params)})
        return
    except ConfigError as e:
        tune.report({metric: worst, "pruned": 1, "reason": f"invalid: {str(e)[:300]}"})
        return
    pool = ray.get_actor(ctx["pool"], namespace=ctx["namespace"])
    slot = wait_for_slot(pool, owner=tune.get_context().get_trial_id())
    try:
        if plan.use_gpu:
            topo = load_topology_file(ctx["topology"])
            explicit = cfg.stages.get(stage).placement
            try:
                # An explicit placement is checked against the topology; otherwise the slot's set is used.
                placement = place_stage(topo, plan.num_workers, None if explicit == "auto" else explicit,
                                        cfg.resources.nccl_env,
                                        gpus=None if explicit != "auto" else ray.get(pool.group.remote(slot)))
            except PlacementError as e:
                raise ConfigError(f"stages.{stage}.placement: {e}") from None
            plan = replace(plan, placement=placement)
        trial_id = tune.get_context().get_trial_id()
        inp = StageInputs.of(cfg, stage, plan, ctx["model_path"], ctx["train_file"], ctx["eval_file"],
                             str(Path(ctx["out"]) / "trials" / trial_id / stage))
        inp.out.mkdir(parents=True, exist_ok=True)
        extra = {"pruned": 0, "predicted_peak_gib": plan.prediction.peak_gib if plan.prediction else None, "slot": slot}

        def attempt(n: int, inp: StageInputs) -> None:
            # The same runner as the pipeline's, with Tune's report callback injected. After an OOM back-off the
            # trial resumes from its last checkpoint at the smaller micro-batch.
            run_stage_on_ray(inp, RayOptions(
                storage_path=ctx["train_storage"], name=f"trial_{trial_id}" + (f"-b{n}" if n else ""),
                cpus_per_worker=cfg.resources.cpus_per_worker, report_evals=True, extra_metrics=extra,
                callbacks=[TuneReportCallback()], env=ctx["worker_env"]))

        run_with_backoff(inp, attempt, cfg.name, cfg.resources.oom_backoff, print, cfg.resources.worker_restarts)
    finally:
        # Synchronous: the process may end right after this function. A trial ASHA stops is killed before it
        # gets here; the driver's SlotReleaser gives its set back then.
        ray.get(pool.release.remote(slot))


def _slot_releaser(pool_name: str, namespace: str):
    from ray import tune

    class SlotReleaser(tune.Callback):
        """Gives a trial's GPU set back when Tune ends it, also when ASHA stops (kills) it mid-run."""

        def _release(self, trial) -> None:
            try:
                pool = ray.get_actor(pool_name, namespace=namespace)
            except ValueError:
                return  # the sweep is over and its pool gone: nothing to give back
            ray.get(pool.release_owner.remote(trial.trial_id))

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._release(trial)

        def on_trial_error(self, iteration, trials, trial, **info):
            self._release(trial)

    return SlotReleaser()


def _sample(sweep, n: int) -> list[dict[str, Any]]:
    """Configurations for a dry run: the grid, or seeded random draws of the space."""
    rng = random.Random(sweep.seed)
    if sweep.searcher == "grid":
        keys = list(sweep.space)
        values = [next(iter(sweep.space[k].values())) for k in keys]
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]
    out = []
    for _ in range(n):
        p = {}
        for key, spec in sweep.space.items():
            (kind, v), = spec.items()
            if kind in ("choice", "grid"):
                p[key] = rng.choice(v)
            elif kind == "uniform":
                p[key] = rng.uniform(*v)
            elif kind == "loguniform":
                p[key] = 10 ** rng.uniform(math.log10(v[0]), math.log10(v[1]))
            else:
                p[key] = rng.randint(v[0], v[1] - 1)  # tune.randint's upper bound is exclusive
        out.append(p)
    return out


def _dry_run(sweep, base: dict[str, Any], budget, echo: Callable[[str], None]) -> dict[str, Any]:
    """Plan sampled trials and say which would be pruned; nothing runs. The data may not be here: run times of
    pruned trials are predicted per 10k records."""
    stage, rows = sweep.stage, []
    for i, params in enumerate(_sample(sweep, sweep.num_samples)):
        c = trial_config(base, stage, params)
        try:
            p = plan_stage(stage, c.stages.get(stage), c.workers_for(stage), c.resources.use_gpu, model_shape(c),
                           budget)
            rows.append({"trial": f"dry_{i}", "status": "fits", "predicted_peak_gib": p.prediction.peak_gib,
                         "params": params})
        except PlanError as e:
            rows.append({"trial": f"dry_{i}", "status": "pruned", "predicted_peak_gib": e.smallest_peak_gib,
                         "params": params, "predicted_run_s": predicted_run_seconds(c, stage, 10_000)})
    echo(format_table(rows, sweep.metric))
    echo(f"would prune {sum(r['status'] == 'pruned' for r in rows)} of {len(rows)}")
    return {"rows": rows, "dry_run": True}


def _prepare(cfg: PipelineConfig, kind: str, out: Path, echo: Callable[[str], None]) -> PreparedData:
    """The sweep's train/held-out split, PII-redacted as the pipeline's is (the opt-out said, the counts shown)."""
    if not cfg.data.redact_pii:
        echo(not_redacted_line([kind]))
    data = prepare_kind(kind, kind_paths(cfg.data, kind), out, cfg.data.eval_fraction, cfg.data.max_records,
                        cfg.data.pii_types())
    echo(prepared_line(data))
    return data


def run_sweep(config_path: str, sets: list[str], sweep_path: str, echo: Callable[[str], None] = print,
              dry_run: bool = False, resume: bool = False) -> dict[str, Any]:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from medgpt_ray.run.ray_env import worker_env

    cfg = load_config(config_path, sets)
    sweep = load_sweep(sweep_path, cfg)
    stage = sweep.stage
    out = (Path(cfg.output_dir) / f"{cfg.name}-tune-{stage}").resolve()
    budget = resolve_budget(cfg, None, 24.0 if dry_run else None)
    base = resolved_dict(cfg)
    trials = len(_sample(sweep, 0)) if sweep.searcher == "grid" else sweep.num_samples
    echo(f"sweep of stage {stage}: {trials} trial(s), {sweep.searcher} search, metric {sweep.metric} "
         f"({sweep.mode}); budget {budget.describe()}")

    def pruned_cost(params: dict[str, Any]) -> float | None:
        return predicted_run_seconds(trial_config(base, stage, params), stage, records)

    if dry_run:
        return _dry_run(sweep, base, budget, echo)

    data = _prepare(cfg, stage_kind(stage).data_kind, out / "data", echo)
    records = data.train_records
    workers = cfg.workers_for(stage)
    # Ray Train's and Tune's storage: resources.storage_path (shared by every node of a cluster), else the sweep's
    # own directory.
    storage_root = Path(cfg.resources.storage_path) / out.name if cfg.resources.storage_path else out
    if cfg.resources.use_gpu:
        from medgpt_ray.run.gpu_placement import find_topology

        topo = find_topology(cfg)
        groups = trial_gpu_groups(topo, workers, cfg.stages.get(stage).placement)
        slots = len(groups)
        topology = topo.source if Path(topo.source).is_file() else cfg.resources.topology_file
    else:
        slots = max(1, int(ray.cluster_resources().get("CPU", 1) // (workers * cfg.resources.cpus_per_worker)))
        groups, topology = [[] for _ in range(slots)], None
    concurrent = slots if sweep.max_concurrent_trials == "auto" else min(slots, sweep.max_concurrent_trials)
    # A fixed namespace: a restored sweep's callbacks (pickled with the experiment) find the new pool by name.
    namespace = "medgpt-tune"
    pool_name = f"medgpt-tune-slots-{cfg.name}-{stage}"
    pool = SlotPool.options(name=pool_name, namespace=namespace, get_if_exists=True).remote(groups)
    ctx = {"base": base, "stage": stage, "metric": sweep.metric, "mode": sweep.mode, "budget": budget,
           "pool": pool_name, "namespace": namespace, "topology": topology, "out": str(out),
           "model_path": str(models.resolve_model_path(cfg.model.path)), "train_file": data.train_file,
           "eval_file": data.eval_file, "worker_env": worker_env(), "pruned_cost": pruned_cost,
           "train_storage": str(storage_root / "train")}
    trainable = tune.with_resources(tune.with_parameters(_trial, ctx=ctx), {"cpu": 0, "memory": 1})
    storage = storage_root / "tune"
    exp = storage / "sweep"
    if resume and tune.Tuner.can_restore(str(exp)):
        echo(f"resuming the sweep in {exp}: finished trials are not rerun")
        tuner = tune.Tuner.restore(str(exp), trainable=trainable, resume_errored=True)
    else:
        search = None
        if sweep.searcher == "optuna":
            from optuna.samplers import TPESampler
            from ray.tune.search.optuna import OptunaSearch

            search = OptunaSearch(sampler=TPESampler(seed=sweep.seed))
        scheduler = ASHAScheduler(grace_period=sweep.grace_period) if sweep.scheduler == "asha" else None
        tuner = tune.Tuner(
            trainable, param_space=param_space(sweep),
            tune_config=tune.TuneConfig(metric=sweep.metric, mode=sweep.mode, search_alg=search, scheduler=scheduler,
                                        num_samples=1 if sweep.searcher == "grid" else sweep.num_samples,
                                        max_concurrent_trials=concurrent),
            run_config=tune.RunConfig(name="sweep", storage_path=str(storage), verbose=0,
                                      callbacks=[_slot_releaser(pool_name, namespace),
                                                 TrialLines(echo, sweep.metric, trials)]))
    echo(f"{concurrent} trial(s) at a time; trials under {exp}")
    # Some metrics exist only in a stage's last report (kto's pair accuracy, grpo's held-out accuracy reward), not
    # at its evaluations during training: Tune would refuse those reports. ASHA skips a report without the metric;
    # a metric no trial reports at all is an error below, with what the stage does report.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    grid = tuner.fit()
    ray.kill(pool)
    return _summarise(grid, sweep, out, echo)


def _summarise(grid, sweep, out: Path, echo: Callable[[str], None]) -> dict[str, Any]:
    rows = []
    for r in grid:
        m = r.metrics or {}
        params = {k: v for k, v in (r.config or {}).items()}
        status = "error" if r.error else "pruned" if m.get("pruned") else "done" if m.get("completed") else "stopped"
        value = m.get(sweep.metric)
        rows.append({"trial": m.get("trial_id") or r.path.rsplit("_", 1)[-1], "status": status,
                     "predicted_peak_gib": m.get("predicted_peak_gib"), "measured_peak_gib": m.get("measured_peak_gib"),
                     sweep.metric: None if status == "pruned" or value is None else value, "params": params,
                     "predicted_run_s": m.get("predicted_run_s"), "reason": m.get("reason")})
    ran = [r for r in rows if r["status"] in ("done", "stopped") and r[sweep.metric] is not None]
    finished = [r.metrics for r in grid if not r.error and (r.metrics or {}).get("completed")]
    if finished and not ran:
        reported = sorted(k for k, v in finished[0].items() if k.startswith("eval_") and isinstance(v, int | float))
        raise ConfigError(f"sweep metric: no trial reported {sweep.metric!r}; the {sweep.stage} stage reports "
                          f"{', '.join(reported) or 'no eval_ metric'}")
    pruned = [r for r in rows if r["status"] == "pruned"]
    saved = sum(r["predicted_run_s"] or 0 for r in pruned)
    best = (min if sweep.mode == "min" else max)(ran, key=lambda r: r[sweep.metric]) if ran else None
    echo(format_table(rows, sweep.metric))
    echo(f"pruned {len(pruned)} of {len(rows)} trial(s) before launch, saving ~{saved / 3600:.2f} GPU-hours "
         f"(their predicted run time)")
    summary = {"rows": rows, "pruned": len(pruned), "saved_gpu_s": saved, "best": best}
    if best is not None:
        path = out / "best_overrides.yaml"
        path.write_text(yaml.safe_dump(override_lines(sweep.stage, best["params"]), sort_keys=True))
        summary["best_overrides"] = str(path)
        echo(f"best: trial {best['trial']} {sweep.metric}={best[sweep.metric]:.4f} -> {path} "
             f"(python jobs/pipeline.py --config ... --overrides {path})")
    (out / "sweep_results.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
