"""How a stage's placement reaches Ray and its workers: per-GPU resource tokens, the workers' environment, and
the device each worker binds. No Ray import: these are the values Ray Train is handed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# ---- Ray obeys -----------------------------------------------------------------------------------------------
# Mechanism, and why: each node advertises one custom resource per physical GPU, `medgpt_gpu_<i>` = 1
# (cluster/start-node.sh, ray_cluster.yaml). Ray Train gives every worker the same resource request, so a
# stage on GPUs [0, 2, 4, 6] asks per worker for GPU: 1 (Ray's count stays right) plus 1/4 of each chosen
# token: the four workers together hold exactly those four tokens, no other medgpt-ray job can take them,
# and only a node where they are free qualifies (the same shares also place 2 workers per node when a stage
# spans nodes). Which device a worker drives is then ours to set: Ray's own GPU ids come from its free list,
# not from our choice, so workers run with RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1 and a
# CUDA_VISIBLE_DEVICES that lists the chosen GPUs first (in local-rank order) and then the node's others --
# Ray Train's device lookup must still find its own id there (Ray issue 49985) -- and each worker binds
# cuda:<local rank> before the stage touches CUDA. Local ranks are contiguous per node because Ray Train
# sorts its workers by node (bundles of one node are not contiguous under PACK: Ray issue 51117).
GPU_TOKEN = "medgpt_gpu_{}"
GPU_SET_ENV = "MEDGPT_GPU_SET"


@dataclass
class StagePlacement:
    gpus: list[int]  # physical indices (PCI bus order) used on each node, in local-rank order
    node_gpus: int  # GPUs per node
    num_workers: int
    cost: float
    nccl_env: dict[str, str]
    runner_up: list[int] | None = None
    source: str = ""

    @property
    def nodes(self) -> int:
        return self.num_workers // len(self.gpus)

    def resources_per_worker(self, advertised: dict[str, float]) -> dict[str, float]:
        """The chosen GPUs' tokens, shared evenly by the workers of one node (only if the cluster has them)."""
        share = 1.0 / len(self.gpus)
        tokens = {GPU_TOKEN.format(g): share for g in self.gpus}
        return tokens if all(t in advertised for t in tokens) else {}

    def worker_env(self) -> dict[str, str]:
        rest = [g for g in range(self.node_gpus) if g not in self.gpus]
        return {**self.nccl_env, "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
                "CUDA_VISIBLE_DEVICES": ",".join(map(str, [*self.gpus, *rest])),
                GPU_SET_ENV: ",".join(map(str, self.gpus))}

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "nodes": self.nodes, "node_gpus": self.node_gpus, "num_workers": self.num_workers,
                "cost": round(self.cost, 4), "runner_up": self.runner_up, "nccl_env": self.nccl_env,
                "topology": self.source}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StagePlacement:
        return cls(d["gpus"], d["node_gpus"], d["num_workers"], d["cost"], d["nccl_env"], d.get("runner_up"),
                   d.get("topology", ""))


def ray_train_resources(placement: StagePlacement | None, num_workers: int, use_gpu: bool, cpus: float,
                        advertised: dict[str, float], base_env: dict[str, str]) -> tuple[dict[str, Any], dict]:
    """ScalingConfig keyword arguments and the workers' environment for a stage (placed or not)."""
    per_worker: dict[str, float] = {"CPU": cpus, **({"GPU": 1} if use_gpu else {})}
    env = dict(base_env)
    if placement is not None:
        per_worker.update(placement.resources_per_worker(advertised))
        env.update(placement.worker_env())
    return {"num_workers": num_workers, "use_gpu": use_gpu, "resources_per_worker": per_worker}, env


def chosen_gpu() -> tuple[int, int] | None:
    """This worker's (device index, physical GPU) under its stage's placement; None without one.

    CUDA_VISIBLE_DEVICES lists the chosen GPUs first, so the device index is the worker's place on its node.
    That is LOCAL_RANK on real nodes; the modulo also covers several simulated nodes on one machine (one IP),
    where Ray Train numbers local ranks across them (ranks of a node are contiguous either way).
    """
    chosen = os.environ.get(GPU_SET_ENV)
    if not chosen:
        return None
    gpus = [int(g) for g in chosen.split(",")]
    index = int(os.environ.get("LOCAL_RANK", "0")) % len(gpus)
    return index, gpus[index]


def bind_worker_device() -> int | None:
    """In a Ray Train worker, before CUDA is touched: drive the chosen GPU of this local rank.

    Returns the physical GPU index (PCI bus order), or None when the stage has no GPU placement.
    """
    chosen = chosen_gpu()
    if chosen is None:
        return None
    index, physical = chosen
    os.environ["ACCELERATE_TORCH_DEVICE"] = f"cuda:{index}"
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(index)
    return physical
