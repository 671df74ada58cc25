"""Which GPUs of a node a stage (or several concurrent jobs) should use, and the NCCL settings for them.

Contention model (costs are relative time per byte of a data-parallel all-reduce):

* A collective is as slow as the slowest link it must cross: the cost of a GPU set
  is the worst link between any two of its GPUs (rings and trees must cross every
  partition of the set at least once).
      NV<n>  0.25   NVLink bridge: a bonus
      PIX    1.0    one PCIe switch, peer-to-peer through it (2.0 without P2P: via host memory)
      PXB    2.0    several switches, no host bridge (without P2P the bytes still go through the CPU)
      PHB    2.0    through the CPU's host bridge
      NODE   2.5    across host bridges of one socket
      SYS    4.0    across sockets (UPI/QPI)
* Without peer-to-peer (GeForce 40-series), every byte goes GPU -> host -> GPU, so
  the GPUs behind one switch share its uplink: the cost is multiplied by the most
  loaded uplink (busy GPUs behind one switch). With P2P, GPUs behind a switch talk
  through it without touching the uplink.
* Concurrent jobs load the uplinks together: a partition is scored by the sum of
  its jobs' costs, each with the uplink load of all the jobs' GPUs, plus a tenth
  of each job's cost on its own (jobs start and finish apart).

Exhaustive search: choosing k of n GPUs is C(n, k) (12,870 for 8 of 16); partitions
are searched recursively with the same model.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Any

from medgpt_ray.topology import Topology

HOP_COST = {"PIX": 1.0, "PXB": 2.0, "PHB": 2.0, "NODE": 2.5, "SYS": 4.0}
NVLINK_COST = 0.25
NO_P2P_SAME_SWITCH_COST = 2.0
TIE_BREAK = 1e-3  # prefer tighter sets (mean link cost) and then lower indices
ALONE_WEIGHT = 0.1


class PlacementError(ValueError):
    pass


def hop_cost(topo: Topology, i: int, j: int) -> float:
    link = topo.link(i, j)
    if link.startswith("NV"):
        return NVLINK_COST
    if link == "PIX" and not topo.p2p_available():
        return NO_P2P_SAME_SWITCH_COST
    return HOP_COST[link]


def uplink_load(topo: Topology, busy: set[int]) -> int:
    if topo.p2p_available():
        return 1
    return max((sum(1 for g in group if g in busy) for group in topo.switch_groups()), default=1) or 1


def set_cost(topo: Topology, gpus: tuple[int, ...], busy: set[int] | None = None) -> float:
    if len(gpus) < 2:
        return 0.0  # one GPU talks to nobody
    pairs = list(itertools.combinations(gpus, 2))
    worst = max(hop_cost(topo, i, j) for i, j in pairs)
    mean = sum(hop_cost(topo, i, j) for i, j in pairs) / len(pairs)
    load = uplink_load(topo, set(busy if busy is not None else gpus))
    return worst * load + TIE_BREAK * mean


@dataclass
class Choice:
    gpus: list[int]
    cost: float
    runner_up: list[int] | None = None
    runner_up_cost: float | None = None
    why: list[str] = field(default_factory=list)


def explain(topo: Topology, gpus: list[int]) -> list[str]:
    if len(gpus) < 2:
        return ["a single GPU: no inter-GPU traffic"]
    worst = max(itertools.combinations(gpus, 2), key=lambda p: hop_cost(topo, *p))
    lines = [f"slowest link GPU{worst[0]}-GPU{worst[1]}: {topo.link(*worst)} (cost {hop_cost(topo, *worst):g})"]
    if not topo.p2p_available():
        shared = [g for g in topo.switch_groups() if sum(1 for x in gpus if x in g) > 1]
        lines.append("no peer-to-peer: traffic goes through host memory; "
                     + (f"switch uplinks shared by {shared}" if shared else "no switch uplink is shared"))
    return lines


def choose_gpus(topo: Topology, k: int, allowed: list[int] | None = None) -> Choice:
    pool = sorted(allowed if allowed is not None else range(topo.n))
    if not 1 <= k <= len(pool):
        raise PlacementError(f"need {k} GPU(s) but the node has {len(pool)} to choose from")
    ranked = sorted((set_cost(topo, c), c) for c in itertools.combinations(pool, k))
    best_cost, best = ranked[0]
    # The runner-up is the best set that costs more: mirror images of the winner on other GPUs teach nothing.
    runner = next(((c, s) for c, s in ranked[1:] if c > best_cost + 1e-9), None)
    return Choice(list(best), best_cost, list(runner[1]) if runner else None, runner[0] if runner else None,
                  explain(topo, list(best)))


def partition_gpus(topo: Topology, sizes: list[int]) -> tuple[list[list[int]], float]:
    """Disjoint GPU sets for jobs that run at the same time, minimising the summed cost."""
    if sum(sizes) > topo.n:
        raise PlacementError(f"{' + '.join(map(str, sizes))} GPUs requested; the node has {topo.n}")
    best: tuple[float, list[list[int]]] | None = None

    def cost_of(jobs: list[tuple[int, ...]]) -> float:
        used = set(itertools.chain.from_iterable(jobs))
        # All jobs busy at once, plus a tenth of each job's cost on its own: concurrent jobs (Tune trials)
        # start and finish apart, and a job spread over distinct switches is faster while its neighbours idle.
        return sum(set_cost(topo, j, used) + ALONE_WEIGHT * set_cost(topo, j) for j in jobs)

    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])  # big jobs first: fewer branches

    def search(idx: int, free: list[int], acc: list[tuple[int, ...]]) -> None:
        nonlocal best
        if idx == len(order):
            total = cost_of(acc)
            if best is None or total < best[0] - 1e-12:
                best = (total, list(map(list, acc)))
            return
        size = sizes[order[idx]]
        for combo in itertools.combinations(free, size):
            # Jobs of equal size are interchangeable: keep them in increasing first-GPU order.
            if acc and sizes[order[idx - 1]] == size and combo[0] < acc[-1][0]:
                continue
            search(idx + 1, [g for g in free if g not in combo], [*acc, combo])

    search(0, sorted(range(topo.n)), [])
    assert best is not None
    jobs: list[list[int]] = [[] for _ in sizes]
    for pos, i in enumerate(order):
        jobs[i] = best[1][pos]
    return jobs, best[0]


def nccl_env(topo: Topology, num_nodes: int = 1, user_env: dict[str, str] | None = None,
             environ: dict[str, str] | None = None) -> dict[str, str]:
    """NCCL and CUDA settings for this topology; a variable the user set (config or environment) is kept."""
    preset: dict[str, str] = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    name = topo.gpu_name.lower()
    if not topo.p2p_available():
        # GeForce 40-series report P2P but corrupt or hang on it; NCCL must go through host memory.
        preset["NCCL_P2P_DISABLE"] = "1"
    if num_nodes == 1:
        preset["NCCL_IB_DISABLE"] = "1"
    else:
        # Consumer boxes talk over Ethernet: more sockets and threads per connection fill a 10-100 GbE link.
        preset["NCCL_IB_DISABLE"] = "1"
        preset["NCCL_SOCKET_NTHREADS"] = "4"
        preset["NCCL_NSOCKS_PERTHREAD"] = "4"
    if any(x in name for x in ("h100", "h200")) and any(topo.link(i, j).startswith("NV")
                                                         for i in range(topo.n) for j in range(topo.n)):
        # NVLink SHARP/multicast is off on the lent H200 machines (FIELD-NOTES).
        preset.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                       "NVSHMEM_DISABLE_NVLS": "1"})
    env = dict(os.environ if environ is None else environ)
    user = dict(user_env or {})
    out = {k: v for k, v in preset.items() if k not in env and k not in user}
    out.update(user)
    return out


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


def place_stage(topo: Topology, num_workers: int, explicit: list[int] | None, user_env: dict[str, str],
                gpus: list[int] | None = None, num_nodes: int | None = None) -> StagePlacement:
    """One stage's GPUs: explicit (checked), given (a partition's share), or chosen by the cost model.

    An explicit list names the GPUs used on every node: 4 workers with [1, 3] run on two nodes."""
    per_node = len(explicit) if explicit else min(num_workers, topo.n)
    if num_workers % per_node:
        raise PlacementError(f"{num_workers} workers do not split evenly over nodes using {per_node} GPU(s) each")
    nodes = num_nodes or num_workers // per_node
    runner_up = None
    if explicit is not None:
        bad = [g for g in explicit if not 0 <= g < topo.n]
        if bad or len(set(explicit)) != len(explicit):
            raise PlacementError(f"placement {explicit}: GPU indices must be distinct and in 0..{topo.n - 1} "
                                 f"({topo.source} has {topo.n} GPUs)")
        chosen, cost = list(explicit), set_cost(topo, tuple(explicit))
    elif gpus is not None:
        chosen, cost = list(gpus), set_cost(topo, tuple(gpus))
    else:
        c = choose_gpus(topo, per_node)
        chosen, cost, runner_up = c.gpus, c.cost, c.runner_up
    return StagePlacement(chosen, topo.n, num_workers, cost, nccl_env(topo, nodes, user_env), runner_up,
                          topo.source)


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
