"""A Ray Train run that only reports where each worker landed: built exactly as the pipeline builds a stage."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import ray
import ray.cloudpickle
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from medgpt_ray.placement.device import StagePlacement, bind_worker_device, ray_train_resources
from medgpt_ray.run.placed_torch import torch_config_for

# Ray workers need not find this test helper on their sys.path: ship its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _report(config):
    import ray.train

    # The backend's train-function context binds the chosen device before the train function runs.
    bound_before = os.environ.get("ACCELERATE_TORCH_DEVICE")
    physical = bind_worker_device()  # what the stage's worker loop does first
    ctx = ray.train.get_context()
    visible = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
    device_index = int(os.environ["ACCELERATE_TORCH_DEVICE"].split(":")[1])
    record = {"rank": ctx.get_world_rank(), "local_rank": ctx.get_local_rank(), "physical_gpu": physical,
              "device_index": device_index, "device_gpu": int(visible[device_index]),
              "node_id": ray.get_runtime_context().get_node_id(),
              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
              "accelerate_device": os.environ.get("ACCELERATE_TORCH_DEVICE"),
              "nccl_p2p_disable": os.environ.get("NCCL_P2P_DISABLE"), "bound_before": bound_before}
    Path(config["out"], f"rank{record['rank']}.json").write_text(json.dumps(record))


def run_placed(placement: StagePlacement, out: Path, storage: Path, name: str) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    # CPU-only machine: logical GPUs, gloo instead of NCCL; everything else as in pipeline.run_stage_on_ray.
    scaling, env = ray_train_resources(placement, placement.num_workers, True, 0.1, ray.cluster_resources(), {})
    TorchTrainer(_report, train_loop_config={"out": str(out)}, scaling_config=ScalingConfig(**scaling),
                 torch_config=torch_config_for(True, backend="gloo"),
                 run_config=RunConfig(name=name, storage_path=str(storage),
                                      worker_runtime_env={"env_vars": env})).fit()
    return sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])
