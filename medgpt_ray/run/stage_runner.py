"""One stage under Ray Train: the one TorchTrainer builder and worker loop; a kind that trains nothing (eval) runs
as one Ray task instead (run_task_on_ray: no Train controller to start).

The pipeline and the Tune sweep both run stages through `run_stage_on_ray`. What differs is injected: the
pipeline passes its progress actor (per-step records to the driver); a Tune trial asks for every evaluation to
be reported (ASHA reads them) and passes Tune's report callback and the metrics its trial adds.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from medgpt_ray.placement.device import chosen_gpu, ray_train_resources
from medgpt_ray.run.placed_torch import torch_config_for
from medgpt_ray.run.process_clock import process_started_wall
from medgpt_ray.run.ray_env import worker_env
from medgpt_ray.run.reward_actor import reward_model_actor
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.stages.outputs import HELD_OUT, is_rank_zero


@dataclass
class RayOptions:
    """How one stage runs under Ray Train, beyond its StageInputs."""

    storage_path: str
    name: str  # the Ray Train run's name (a directory under storage_path)
    cpus_per_worker: float = 1.0
    progress: tuple[str, str] | None = None  # (actor name, namespace) of a ProgressActor to push records to
    report_evals: bool = False  # every evaluation becomes a Ray Train report (a Tune trial: ASHA reads them)
    extra_metrics: dict[str, Any] = field(default_factory=dict)  # added to the stage's last report
    callbacks: list[Any] = field(default_factory=list)  # Ray Train RunConfig callbacks (TuneReportCallback)
    # The workers' environment; None: this process's worker_env(). A Tune trial runs in an actor that does not
    # have the driver's environment, so the driver computes it.
    env: dict[str, str] | None = None


def start_worker() -> None:
    """First thing in every stage worker, before CUDA is touched."""
    from medgpt_ray.tiny import cache_root, use_compile_caches

    # What a worker writes (checkpoints, the model, metrics.jsonl) was trained on or holds medical records: owner-only.
    os.umask(0o077)
    # Each report's INFO line ("Reporting training result ...") would interleave with the progress lines.
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    # DeepSpeed JIT-builds its CPU comm op (~25 s) on first use: keep the build for later stages and runs.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache_root() / "torch_extensions"))
    use_compile_caches()  # before anything compiles: inductor and Triton read them when they first do
    # The GPU the placement chose is bound before this runs, by the placed backend's train-function context.


def _report(metrics: dict[str, Any], name: str, payload: Any) -> None:
    """A Ray Train report on every rank (V2 reports are collective). Train V2 keeps metrics only when they come
    with a checkpoint: rank 0 attaches `payload` as a small one."""
    import ray.train

    if is_rank_zero():
        with tempfile.TemporaryDirectory() as d:
            Path(d, name).write_text(json.dumps(payload, ensure_ascii=False, default=str), encoding="utf-8")
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
    else:
        ray.train.report(metrics, checkpoint=None)


# TRL's names for the held-out pair accuracy and margin (DPO, ORPO, CPO/SimPO) and the ones the stage result, the
# summary and a sweep's `metric` use: a sweep on eval_reward_accuracy reads it at every evaluation, not only the last.
TRL_PAIR_METRICS = {"eval_rewards/accuracies": "eval_reward_accuracy", "eval_rewards/margins": "eval_reward_margin"}


def eval_to_ray_train():
    """A trainer callback: every evaluation becomes a Ray Train report on every rank (what Tune's scheduler reads).
    Defined in the training worker: transformers' trainer modules (and peft, which they import) take ~3.5 s to
    import on a 2-core box, in every process that imports this module, and a Tune trial's process (which plans the
    trial, prunes it or starts its Ray Train run) never trains."""
    from transformers import TrainerCallback

    class EvalToRayTrain(TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            values = eval_report_values(metrics or {}, state.global_step)
            _report(values, "eval.json", values)

    return EvalToRayTrain()


def eval_report_values(metrics: dict[str, Any], step: int) -> dict[str, Any]:
    """An evaluation's numbers as Ray Train reports them: the scalars, TRL's pair metrics under our names too."""
    values: dict[str, Any] = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
    values.update({ours: values[trl] for trl, ours in TRL_PAIR_METRICS.items() if trl in values})
    values["step"] = step
    return values


def final_metrics(result: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """The stage's last report: its scalar results and its evaluation, flat. `completed`, not `done`: Tune reads
    a truthy `done` as the trial's end and stops it on the spot, before the trial gives its GPU set back."""
    import torch

    out = {k: v for k, v in result.items() if isinstance(v, int | float | str) or v is None}
    out.update(result.get(HELD_OUT, {}))
    out.update({"completed": 1, **extra})
    if torch.cuda.is_available():
        out["measured_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def _worker_loop(config: dict[str, Any]) -> None:
    """Runs in every Ray Train worker: the plain stage function with what the runner injects, result to Ray."""
    entered = time.time()
    from medgpt_ray.stages import run_stage

    start_worker()
    sink = None
    if config["progress"] is not None:
        actor = ray.get_actor(config["progress"][0], namespace=config["progress"][1])

        def sink(rec: dict[str, Any]) -> None:
            actor.push.remote(rec)

        if is_rank_zero():  # the worker is up: the first of a stage's start-up times
            sink({"stage": config["inputs"].stage, "phase": "worker_up", "worker_up_wall": time.time(),
                  "train_fn_wall": entered, "worker_process_wall": process_started_wall()})

    callbacks = [eval_to_ray_train()] if config["report_evals"] else []
    result = run_stage(config["inputs"], sink, callbacks)
    _report(final_metrics(result, config["extra_metrics"]), "result.json", result)


def run_stage_on_ray(inputs: StageInputs, opts: RayOptions):
    """Build the stage's TorchTrainer (workers placed on the plan's GPUs) and fit it."""
    plan = inputs.plan
    base_env = worker_env() if opts.env is None else opts.env
    scaling, env = ray_train_resources(plan.placement, plan.num_workers, plan.use_gpu, opts.cpus_per_worker,
                                       ray.cluster_resources(), base_env)
    with reward_model_actor(inputs, base_env) as placed_inputs:  # reward_model_gpu: the rm in an actor of its own
        return _fit(placed_inputs, opts, scaling, env)


def _fit(inputs: StageInputs, opts: RayOptions, scaling: dict[str, Any], env: dict[str, str]):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        _worker_loop,
        train_loop_config={"inputs": inputs, "progress": opts.progress, "report_evals": opts.report_evals,
                           "extra_metrics": opts.extra_metrics},
        scaling_config=ScalingConfig(**scaling),
        torch_config=torch_config_for(inputs.plan.placement is not None),
        # Ray Train's INFO lines (resource requests, every report) drown our progress lines.
        run_config=RunConfig(name=opts.name, storage_path=opts.storage_path, callbacks=opts.callbacks,
                             logging_config=ray.LoggingConfig(log_level="WARNING"),
                             worker_runtime_env={"env_vars": env}),
    )
    if opts.progress is not None:  # the first start-up mark: what the driver did after the start line ends here
        progress = ray.get_actor(opts.progress[0], namespace=opts.progress[1])
        progress.push.remote({"stage": inputs.stage, "phase": "fit", "fit_wall": time.time()})
    return trainer.fit()


def _task(inputs: StageInputs, progress: tuple[str, str] | None) -> dict[str, Any]:
    """A stage kind that trains nothing, in one Ray task: the plain stage function, on the planned GPU if any."""
    from medgpt_ray.stages import run_stage

    start_worker()
    placed = chosen_gpu()
    if placed is not None:  # before CUDA initialises: the placement's GPU is this process's only device
        os.environ["CUDA_VISIBLE_DEVICES"] = str(placed[1])
    sink = None
    if progress is not None:
        actor = ray.get_actor(progress[0], namespace=progress[1])

        def sink(rec: dict[str, Any]) -> None:
            actor.push.remote(rec)

    return run_stage(inputs, sink)


def run_task_on_ray(inputs: StageInputs, opts: RayOptions) -> dict[str, Any]:
    """Run a non-training stage (config/registry.py StageKind.trains false) as one Ray task with the resources and
    environment its single worker would get under Ray Train; returns its result."""
    plan = inputs.plan
    scaling, env = ray_train_resources(plan.placement, 1, plan.use_gpu, opts.cpus_per_worker,
                                       ray.cluster_resources(), worker_env() if opts.env is None else opts.env)
    per = dict(scaling["resources_per_worker"])
    cpus, gpus = per.pop("CPU"), per.pop("GPU", 0)
    task = ray.remote(_task).options(num_cpus=cpus, num_gpus=gpus, resources=per or None, max_retries=0,
                                     runtime_env={"env_vars": env}, name=opts.name)
    return ray.get(task.remote(inputs, opts.progress))
