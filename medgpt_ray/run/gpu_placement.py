"""GPUs for the stages of a wave: the cluster's topology, then one placement per GPU stage.

Stages that run side by side get disjoint sets chosen together (placement.partition_gpus);
each choice is printed; the plans returned carry it with its NCCL environment (run/job.py writes plan.json).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from medgpt_ray.config import ConfigError, OnlineRLStageConfig, PipelineConfig
from medgpt_ray.memory.stage_plan import StagePlan
from medgpt_ray.placement.policy import PlacementError, partition_gpus, place_stage
from medgpt_ray.placement.topology import NoGPUError, Topology, load_topology_file, read_local_topology


def find_topology(cfg: PipelineConfig) -> Topology:
    """The configured file, this machine, or `nvidia-smi topo -m` run by a task on a GPU node."""
    if cfg.resources.topology_file:
        return load_topology_file(cfg.resources.topology_file)
    try:
        return read_local_topology()
    except NoGPUError:
        gpu_nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]
        if not gpu_nodes:
            raise ConfigError("resources.use_gpu is true but no node of the cluster has a GPU") from None
        task = ray.remote(num_cpus=0)(read_local_topology).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(gpu_nodes[0], soft=False))
        return ray.get(task.remote(), timeout=120)


def place_wave(cfg: PipelineConfig, topo: Topology, stages: list[str], plans: dict[str, StagePlan], parallel: bool,
               echo: Callable[[str], None]) -> dict[str, StagePlan]:
    """The wave's plans with the GPUs of each GPU stage (disjoint sets chosen together when they run side by
    side): new plans, the ones given unchanged."""
    plans = dict(plans)
    gpu_stages = [s for s in stages if plans[s].use_gpu]
    if not gpu_stages:
        return plans
    explicit = {s: cfg.stages.get(s).placement for s in gpu_stages}
    shares: dict[str, list[int] | None] = {s: None for s in gpu_stages}
    if parallel and len(gpu_stages) > 1 and all(explicit[s] == "auto" for s in gpu_stages):
        jobs, _ = partition_gpus(topo, [min(plans[s].num_workers, topo.n) for s in gpu_stages])
        shares = dict(zip(gpu_stages, jobs, strict=True))
    for s in gpu_stages:
        plans[s] = place_one(cfg, topo, s, plans[s], shares[s], echo)
    taken = {g for s in (gpu_stages if parallel else []) for g in plans[s].placement.gpus}
    for s in gpu_stages:
        c = cfg.stages.get(s)
        if isinstance(c, OnlineRLStageConfig) and c.reward_model_gpu:
            plans[s] = place_reward_model(s, plans[s], topo, taken)
            taken.add(plans[s].reward_model_gpu)
            echo(f"[{s:>3}] reward model on GPU {plans[s].reward_model_gpu}, its own (a Ray actor beside the "
                 f"workers on GPUs {plans[s].placement.gpus})")
    used = [g for s in gpu_stages for g in plans[s].placement.gpus] if parallel else []
    used += [plans[s].reward_model_gpu for s in gpu_stages if parallel and plans[s].reward_model_gpu is not None]
    if len(used) != len(set(used)):
        raise ConfigError(f"stages {', '.join(gpu_stages)} run side by side on overlapping GPUs {used}; "
                          f"give them disjoint stages.<stage>.placement lists or leave them on auto")
    return plans


def place_one(cfg: PipelineConfig, topo: Topology, stage: str, plan: StagePlan, gpus: list[int] | None,
              echo: Callable[[str], None]) -> StagePlan:
    """The plan with the stage's GPUs: its explicit stages.<stage>.placement (checked), else `gpus` (a share chosen
    with other stages or trials), else the cost model's choice; the choice said in one line."""
    explicit = cfg.stages.get(stage).placement
    try:
        p = place_stage(topo, plan.num_workers, None if explicit == "auto" else explicit, cfg.resources.nccl_env,
                        gpus=gpus if explicit == "auto" else None)
    except PlacementError as e:
        raise ConfigError(f"stages.{stage}.placement: {e}") from None
    env = " ".join(f"{k}={v}" for k, v in p.nccl_env.items())
    echo(f"[{stage:>3}] GPUs {p.gpus} on each of {p.nodes} node(s) (cost {p.cost:.2f}"
         f"{'' if p.runner_up is None else f', runner-up {p.runner_up}'}); {env}")
    return replace(plan, placement=p)


def place_reward_model(stage: str, plan: StagePlan, topo: Topology, taken: set[int]) -> StagePlan:
    """The plan with a GPU for its reward model's actor: the lowest-numbered one of the node that neither this
    stage's workers nor a stage beside it use (the scores it sends back are a few floats: no link to optimise)."""
    free = [g for g in range(topo.n) if g not in plan.placement.gpus and g not in taken]
    if not free:
        raise ConfigError(f"stages.{stage}.reward_model_gpu: the reward model needs a GPU of its own and the node's "
                          f"{topo.n} GPU(s) are taken ({sorted({*plan.placement.gpus, *taken})}); use fewer workers "
                          f"(stages.{stage}.num_workers) or set reward_model_gpu: false")
    on = (plan.reward_model_on or "").split(": ", 1)[-1]
    return replace(plan, reward_model_gpu=free[0], reward_model_on=f"GPU {free[0]}, its own (a Ray actor): {on}")
