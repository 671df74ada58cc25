"""One stage under Ray Train: the workers' environment, their start, their last report, the TorchTrainer.

The pipeline and the Tune sweep both run stages through here.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import ray

from medgpt_ray.config import PipelineConfig
from medgpt_ray.placement import StagePlacement, bind_worker_device, ray_train_resources
from medgpt_ray.stages.common import INJECT_OOM_ENV, StageInputs

# Workers inherit these: no doubled prints / dill dumps from Train V2's print patch (FIELD-NOTES).
WORKER_ENV = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0", "TOKENIZERS_PARALLELISM": "false",
              "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def worker_env() -> dict[str, str]:
    env = dict(WORKER_ENV)
    if os.environ.get(INJECT_OOM_ENV):  # the OOM back-off test hook reaches the workers too
        env[INJECT_OOM_ENV] = os.environ[INJECT_OOM_ENV]
    return env


def start_worker() -> None:
    """First thing in every stage worker, before CUDA is touched."""
    from medgpt_ray.tiny import cache_root

    # Each report's INFO line ("Reporting training result ...") would interleave with the progress lines.
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    # DeepSpeed JIT-builds its CPU comm op (~25 s) on first use: keep the build for later stages and runs.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache_root() / "torch_extensions"))
    bind_worker_device()  # the GPU the placement chose for this local rank


def report_with_receipt(metrics: dict[str, Any], result: dict[str, Any]) -> None:
    """The stage's last report, on every rank (V2 reports are collective). Train V2 keeps metrics only when
    they come with a checkpoint: rank 0 attaches the stage's result.json."""
    import ray.train

    if ray.train.get_context().get_world_rank() == 0:
        with tempfile.TemporaryDirectory() as d:
            Path(d, "result.json").write_text(json.dumps(result, ensure_ascii=False, default=str), encoding="utf-8")
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
    else:
        ray.train.report(metrics, checkpoint=None)


def _train_loop_per_worker(config: dict[str, Any]) -> None:
    """Runs in every Ray Train worker: the plain stage function, progress to the actor, result to Ray."""
    from medgpt_ray.stages import run_stage

    start_worker()
    actor = ray.get_actor(config["progress_actor"], namespace=config["namespace"])
    result = run_stage(config["inputs"], sink=lambda rec: actor.push.remote(rec))
    metrics = {k: v for k, v in result.items() if isinstance(v, int | float | str) or v is None}
    metrics.update({f"eval/{k}": v for k, v in result.get("eval", {}).items()})
    report_with_receipt(metrics, result)


def run_stage_on_ray(inputs: StageInputs, cfg: PipelineConfig, storage_path: str, name: str,
                     progress_actor: str, namespace: str):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    plan = inputs.plan
    placement = StagePlacement.from_dict(plan.placement) if plan.placement else None
    scaling, env = ray_train_resources(placement, plan.num_workers, plan.use_gpu, cfg.resources.cpus_per_worker,
                                       ray.cluster_resources(), worker_env())
    trainer = TorchTrainer(
        _train_loop_per_worker,
        train_loop_config={"inputs": inputs, "progress_actor": progress_actor, "namespace": namespace},
        scaling_config=ScalingConfig(**scaling),
        # Ray Train's INFO lines (resource requests, every report) drown our progress lines.
        run_config=RunConfig(name=name, storage_path=storage_path,
                             logging_config=ray.LoggingConfig(log_level="WARNING"),
                             worker_runtime_env={"env_vars": env}),
    )
    return trainer.fit()
