"""One Tune trial: its configuration's stage as a StageJob, the pipeline's own (docs/ARCHITECTURE.md: Tune
semantics). Planned first, at rows of seq_len: one that cannot fit reports the worst value flagged `pruned` and no
Ray Train worker is created for it. Otherwise planned again at the lengths of the sweep's train split, placed on
the GPU set of a slot, run with the pipeline's back-off, the slot given back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from medgpt_ray.config import ConfigError, PipelineConfig, stage_kind
from medgpt_ray.data.prepare import PreparedData
from medgpt_ray.memory.budget import Budget
from medgpt_ray.memory.planner import PlanError
from medgpt_ray.memory.stage_plan import StagePlan
from medgpt_ray.placement.topology import load_topology_file
from medgpt_ray.run.job import StageJob
from medgpt_ray.run.manifest import sha256_json, write_json_atomic
from medgpt_ray.run.stage_runner import RayOptions, run_stage_on_ray
from medgpt_ray.tune.sweep import PENALTY, predicted_run_seconds, trial_config, wait_for_slot


@dataclass(frozen=True)
class TrialContext:
    """What every trial of a sweep shares (pickled into each trial by tune.with_parameters)."""

    base: dict[str, Any]  # the resolved pipeline config (its --set and --overrides applied)
    stage: str
    metric: str
    mode: str
    budget: Budget
    pool: str  # the SlotPool actor's name
    namespace: str
    topology: str | None  # a topology file the trials load (GPU sweeps)
    out: str  # the sweep's directory: trials/<trial id>/<stage>
    model_path: str  # what the trials start from: the base model resolved, or a --from-run's upstream output
    data: PreparedData  # the sweep's split of the stage's data kind (run/stage_data.py, as the pipeline's)
    worker_env: dict[str, str]
    train_storage: str  # Ray Train's storage for the trials' runs
    needs: dict[str, str] = field(default_factory=dict)  # {stage: output model} the stage reads (--from-run)


def trial(params: dict[str, Any], ctx: TrialContext) -> None:
    """The Tune trainable: plan (prune if it cannot fit), take a slot, run the stage, give the slot back."""
    from ray import tune

    trial_id = tune.get_context().get_trial_id()
    worst = PENALTY if ctx.mode == "min" else -PENALTY
    try:
        cfg = trial_config(ctx.base, ctx.stage, params)
        job = StageJob(cfg, ctx.stage, Path(ctx.out) / "trials" / trial_id / ctx.stage, print)
        plan = job.plan_at_lengths(job.plan(ctx.budget), ctx.budget, Path(ctx.model_path),
                                   {stage_kind(ctx.stage).data_kind: ctx.data})
    except PlanError as e:
        # Never launched: no Ray Train worker exists for it. The searcher sees the worst value.
        tune.report({ctx.metric: worst, "pruned": 1, "predicted_peak_gib": e.smallest_peak_gib,
                     "reason": str(e).splitlines()[0][:300],
                     "predicted_run_s": predicted_run_seconds(cfg, ctx.stage, ctx.data.train_records)})
        return
    except ConfigError as e:
        tune.report({ctx.metric: worst, "pruned": 1, "reason": f"invalid: {str(e)[:300]}"})
        return
    pool = ray.get_actor(ctx.pool, namespace=ctx.namespace)
    slot = wait_for_slot(pool, owner=trial_id)
    try:
        _run(job, cfg, plan, ctx, trial_id, params, slot, pool)
    finally:
        # Synchronous: the process may end right after this function. A trial ASHA stops is killed before it
        # gets here; the driver's SlotReleaser gives its set back then.
        ray.get(pool.release.remote(slot))


def _run(job: StageJob, cfg: PipelineConfig, plan: StagePlan, ctx: TrialContext, trial_id: str,
         params: dict[str, Any], slot: int, pool) -> None:
    """The trial's stage on its slot's GPU set (an explicit stages.<stage>.placement is checked and used instead),
    under Ray Train with Tune's report callback; after an OOM back-off it resumes from its last checkpoint."""
    from ray.tune.integration.ray_train import TuneReportCallback

    if plan.use_gpu:
        plan = job.place(plan, load_topology_file(ctx.topology), ray.get(pool.group.remote(slot)))
    # A trial Tune restores (resume_errored) resumes its own attempt, at the back-offs it took; one resumed from
    # another start (a new --from-run) starts over: its checkpoints were trained from another model.
    start = {"starts_from": ctx.model_path, "needs": ctx.needs}
    plan = job.enter(plan, sha256_json({"trial": trial_id, "params": params, **start}), fresh=False)
    # Provenance beside plan.json: what this trial trained from is otherwise only in the driver's output.
    write_json_atomic(job.out_dir / "trial.json", {**start, "params": params})
    inputs = job.inputs(plan, ctx.model_path, ctx.data, ctx.needs)
    extra = {"pruned": 0, "predicted_peak_gib": plan.prediction.peak_gib if plan.prediction else None, "slot": slot}

    def attempt(n: int, inp) -> None:
        run_stage_on_ray(inp, RayOptions(
            storage_path=ctx.train_storage, name=f"trial_{trial_id}" + (f"-b{n}" if n else ""),
            cpus_per_worker=cfg.resources.cpus_per_worker, report_evals=True, extra_metrics=extra,
            callbacks=[TuneReportCallback()], env=ctx.worker_env))

    job.run(inputs, attempt)
