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
from dataclasses import dataclass, field

from medgpt_ray.placement.device import StagePlacement
from medgpt_ray.placement.nccl import nccl_env
from medgpt_ray.placement.topology import Topology

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
