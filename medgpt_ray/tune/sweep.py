"""Ray Tune sweeps over one stage, with the memory planner as gatekeeper and the placement policy as packer.

Each trial is a Tune function trainable with no CPU of its own (FIELD-NOTES: it would deadlock the inner
workers on a small machine). It first plans its stage for the per-GPU budget; a trial predicted not to fit
reports the worst value of the metric flagged `pruned` and returns: no Ray Train worker is ever created
for it, and the searcher (Optuna TPE by default) learns that region is bad. A trial that fits takes a GPU
set from the pool (disjoint sets chosen together by placement.partition_gpus), runs the real stage as a
Ray Train TorchTrainer reporting its evaluations through TuneReportCallback (ASHA stops the weak ones),
and gives the set back.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError

from medgpt_ray.config import STAGE_KINDS, ConfigError, PipelineConfig
from medgpt_ray.config.base import _format_validation_error, _Strict

PENALTY = 1e9  # the value a pruned trial reports: the worst for the searcher in either mode


class SweepConfig(_Strict):
    stage: str  # a stage kind (config.STAGE_KINDS)
    metric: str = "eval_loss"  # a key of the stage's evaluation (eval_loss, eval_accuracy, eval_reward_accuracy...)
    mode: Literal["min", "max"] = "min"
    num_samples: Annotated[int, Field(ge=1)] = 8
    searcher: Literal["optuna", "random", "grid"] = "optuna"
    seed: int = 0
    scheduler: Literal["asha", "none"] = "asha"
    grace_period: Annotated[int, Field(ge=1)] = 1  # evaluations before ASHA may stop a trial
    max_concurrent_trials: Literal["auto"] | Annotated[int, Field(ge=1)] = "auto"
    # Dotted keys under stages.<stage> -> {choice: [...]}, {grid: [...]}, {uniform|loguniform|randint: [lo, hi]}
    space: dict[str, dict[Literal["choice", "grid", "uniform", "loguniform", "randint"], list[Any]]]


def load_sweep(path: str | Path, cfg: PipelineConfig | None = None,
               from_run: str | Path | None = None) -> SweepConfig:
    """The sweep file, checked; with the pipeline config it runs on, also checked against it. `from_run`: the
    finished run (--from-run) that gives the stage its `needs` (tune/upstream.py checks it has them)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"sweep file not found: {p}")
    try:
        tree = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        sweep = SweepConfig.model_validate(tree)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: invalid YAML: {e}") from None
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, str(p))) from None
    if sweep.stage not in STAGE_KINDS:
        raise ConfigError(f"{p}: stage: '{sweep.stage}' is not one of {', '.join(STAGE_KINDS)}")
    for key, spec in sweep.space.items():
        if len(spec) != 1:
            raise ConfigError(f"{p}: space.{key}: exactly one of choice, grid, uniform, loguniform, randint")
    if sweep.searcher == "grid" and any("grid" not in s and "choice" not in s for s in sweep.space.values()):
        raise ConfigError(f"{p}: searcher grid needs every space entry to be a list (grid or choice)")
    if cfg is not None and (cfg.passes_on(sweep.stage) or _may_be_zero(sweep.space.get("max_steps"))):
        raise ConfigError(f"{p}: the sweep trains stages.{sweep.stage}, but max_steps 0 trains nothing (the stage "
                          "passes its input model on): give max_steps -1 (run `epochs`) or a positive count")
    if cfg is not None and from_run is None and (needs := sorted(cfg.stages.get(sweep.stage).needs)):
        # A trial trains the one stage alone: no stage of the pipeline runs before it to give it these.
        raise ConfigError(f"{p}: the sweep trains stages.{sweep.stage} alone, but it needs the output of stage(s) "
                          f"{', '.join(needs)}, which no trial runs: give --from-run RUN, a finished pipeline run "
                          f"(runs/<name>) the trials read them from, or point its config at a model directory "
                          f"instead (e.g. a finished run's runs/<name>/{needs[0]}/model)")
    if cfg is not None and sweep.scheduler == "asha" and "eval_steps" not in sweep.space \
            and cfg.stages.get(sweep.stage).eval_steps is None:
        # Without evaluations during training a trial reports once, at its end: ASHA could stop nothing.
        raise ConfigError(f"{p}: scheduler asha stops trials at their evaluations, but stages.{sweep.stage}.eval_steps "
                          f"is not set (the stage evaluates once, at the end): set stages.{sweep.stage}.eval_steps "
                          f"or use scheduler: none")
    return sweep


def _may_be_zero(spec: dict[str, list[Any]] | None) -> bool:
    """Whether a space entry can draw 0: a listed 0, or a range that holds it."""
    if not spec:
        return False
    (kind, values), = spec.items()
    if kind in ("choice", "grid"):
        return 0 in values
    return len(values) >= 2 and values[0] <= 0 < values[1] + (1 if kind == "randint" else 0)


def param_space(sweep: SweepConfig) -> dict[str, Any]:
    from ray import tune

    out: dict[str, Any] = {}
    for key, spec in sweep.space.items():
        (kind, values), = spec.items()
        if kind in ("grid",) or (kind == "choice" and sweep.searcher == "grid"):
            out[key] = tune.grid_search(values)
        elif kind == "choice":
            out[key] = tune.choice(values)
        elif kind == "uniform":
            out[key] = tune.uniform(*values)
        elif kind == "loguniform":
            out[key] = tune.loguniform(*values)
        else:
            out[key] = tune.randint(*values)
    return out


def trial_config(base: dict[str, Any], stage: str, params: dict[str, Any]) -> PipelineConfig:
    """The pipeline config of one trial: the base config with stages.<stage>.<key> = value for each param."""
    from medgpt_ray.config import apply_override

    tree = json.loads(json.dumps(base))
    for key, value in params.items():
        apply_override(tree, ["stages", stage, *key.split(".")], value, f"sweep space.{key}")
    try:
        return PipelineConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, "sweep trial")) from None


def override_lines(stage: str, params: dict[str, Any]) -> dict[str, Any]:
    """The best trial as a `--overrides` file: dotted keys the pipeline accepts."""
    return {f"stages.{stage}.{k}": v for k, v in sorted(params.items())}


def predicted_run_seconds(cfg: PipelineConfig, stage: str, records: int) -> float | None:
    """How long the stage would run on the configured GPU type were memory no limit (the planner's fastest plan
    and its throughput prediction): what pruning a trial saves. None when it cannot be planned at all."""
    from medgpt_ray.memory.budget import make_budget
    from medgpt_ray.memory.planner import model_shape, plan_stage
    from medgpt_ray.memory.profiles import stage_profile

    s = cfg.stages.get(stage)
    gpu_type = "rtx4090" if cfg.resources.gpu_type == "auto" else cfg.resources.gpu_type
    try:
        plan = plan_stage(stage, s, cfg.workers_for(stage), True, model_shape(cfg),
                          make_budget(None, 0.0, gpu_type, True, "no memory limit"))
    except ConfigError:
        return None
    steps = s.max_steps if s.max_steps > 0 else math.ceil(s.epochs * records / s.effective_batch)
    tokens = steps * s.effective_batch * s.seq_len * stage_profile(stage).sequences_per_example  # pairs: 2
    return tokens / (plan.prediction.tokens_per_s_per_gpu * plan.num_workers)


def format_table(rows: list[dict[str, Any]], metric: str) -> str:
    """One line per trial; columns as wide as their longest cell (Tune's trial ids, a metric's name)."""
    tw, mw = max([len("trial"), *(len(str(r["trial"])) for r in rows)]) + 1, max(12, len(metric) + 1)
    head = f"{'trial':<{tw}}{'status':<9}{'pred GiB':>9}{'meas GiB':>9}{metric:>{mw}}  params"
    lines = [head, "-" * len(head)]
    for r in rows:
        pred, meas, m = r.get("predicted_peak_gib"), r.get("measured_peak_gib"), r.get(metric)
        cells = ["" if pred is None else f"{pred:.3f}", "" if meas is None else f"{meas:.2f}",
                 "" if m is None else f"{m:.4f}"]
        lines.append(f"{r['trial']:<{tw}}{r['status']:<9}{cells[0]:>9}{cells[1]:>9}{cells[2]:>{mw}}  "
                     f"{json.dumps(r['params'], sort_keys=True)}")
    return "\n".join(lines)


def trial_gpu_groups(topo, workers: int, explicit: Literal["auto"] | list[int]) -> list[list[int]]:
    """The GPU sets concurrent trials take turns on: disjoint sets chosen together by the placement policy, or the
    one set stages.<stage>.placement names (trials then run one at a time on it)."""
    from medgpt_ray.placement.policy import partition_gpus

    if explicit != "auto":
        return [list(explicit)]
    per_trial = min(workers, topo.n)
    groups, _ = partition_gpus(topo, [per_trial] * max(1, topo.n // per_trial))
    return groups


def wait_for_slot(pool, poll_s: float = 0.5, owner: str = "") -> int:
    import ray

    while True:
        slot = ray.get(pool.acquire.remote(owner))
        if slot is not None:
            return slot
        time.sleep(poll_s)


__all__ = ["PENALTY", "SweepConfig", "format_table", "load_sweep", "override_lines", "param_space",
           "predicted_run_seconds", "trial_config", "trial_gpu_groups", "wait_for_slot"]
