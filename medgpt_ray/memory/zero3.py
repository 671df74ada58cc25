"""ZeRO-3's gathered parameters: what DeepSpeed's parameter coordinator holds whole on a GPU while the model runs,
and how many elements it all-gathers per micro-batch (docs/ARCHITECTURE.md, "memory/").

DeepSpeed 0.19 (runtime/zero/partitioned_param_coordinator.py) gathers a module's parameters when its hook fetches it
(an nn.Linear's weight, an embedding, a ZeRO-3 leaf's whole tree: Qwen3-MoE's sparse block, router and 128 fused
experts, ~604 M elements a layer for Qwen3-30B-A3B), then, at every fetch, prefetches the next parameters of the
recorded trace while fewer than `stage3_prefetch_bucket_size` elements were taken (the one that crosses it is taken
whole) and fewer than `stage3_max_live_parameters` are gathered: the gathered set fills up to the live limit. When
a module is done its parameters are freed unless a running module still holds them, or the trace uses them again
within `stage3_max_reuse_distance` elements: at the turn from forward to backward the LM head and the last layers
stay gathered (a 0.5B model stays gathered whole). Frozen parameters that a checkpointed layer's recompute fetched
are freed when the backward module that triggered it is done, and fetched again: LoRA's base is gathered about
three times a micro-batch. Parameters of at most `stage3_param_persistence_threshold` elements are never
partitioned. With one rank nothing is copied (the gathered tensor is a view of the partition) unless the partition
lives on the CPU (parameter offload).

This module replays that policy on the fetch order of one micro-batch built from the model's shape
(memory/zero3_trace.py); bench/zero3_gather_check.py checks both against DeepSpeed's own coordinator, which they
match exactly (bench/results/zero3_gather_check_cpu.json). The settings are the ones stage_plan.py writes into
every ZeRO-3 DeepSpeed config (reuse distance: DeepSpeed's default, which the config leaves).
"""
from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

from medgpt_ray.memory.shapes import ModelShape
from medgpt_ray.memory.zero3_trace import Step, Trace, trace

PREFETCH_BUCKET_ELEMENTS = 50_000_000  # stage3_prefetch_bucket_size
MAX_LIVE_ELEMENTS = 1_000_000_000  # stage3_max_live_parameters
PERSISTENCE_THRESHOLD = 100_000  # stage3_param_persistence_threshold
MAX_REUSE_DISTANCE = 1_000_000_000  # stage3_max_reuse_distance (DeepSpeed's default)


@dataclass(frozen=True)
class Policy:
    """The four ZeRO-3 settings the replay follows (bench/zero3_gather_check.py replays others against DeepSpeed)."""

    prefetch_bucket: int = PREFETCH_BUCKET_ELEMENTS
    max_live: int = MAX_LIVE_ELEMENTS
    persistence_threshold: int = PERSISTENCE_THRESHOLD
    max_reuse_distance: int = MAX_REUSE_DISTANCE


PLANNED = Policy()  # what stage_plan.py writes


@dataclass(frozen=True)
class Gathered:
    peak_elements: int  # the most parameter elements gathered (whole) at once during a micro-batch
    per_micro_batch: int  # elements all-gathered during one micro-batch (forward, backward and recompute)
    largest_module: int  # the largest module's own partitioned parameters: the unit DeepSpeed gathers at once
    # With more than one rank, a gather of several parameters lands in one flat buffer that each parameter is
    # copied out of when it is waited for (partition_parameters.AllGatherCoalescedHandle): for that moment the
    # group is held twice. The most elements then: what a multi-rank GPU holds at the worst moment.
    peak_with_buffers: int = 0


class _Reuse:
    """DeepSpeed's reuse-distance walk: after a release at fetch count `t`, a parameter stays gathered when a module
    from position t on uses it before `distance` elements of the modules' parameters were walked (each module's
    own parameters; every parameter under it when the released module is a leaf)."""

    def __init__(self, steps: list[Step], size: list[int], distance: int) -> None:
        self.distance = distance
        self.uses: dict[bool, dict[int, list[int]]] = {False: {}, True: {}}
        self.cum: dict[bool, list[int]] = {}
        for tree in (False, True):
            params = [st.tree if tree else st.own for st in steps]
            self.cum[tree] = [0, *accumulate(sum(size[p] for p in ps) for ps in params)]
            for at, ps in enumerate(params):
                for p in ps:
                    self.uses[tree].setdefault(p, []).append(at)

    def soon(self, p: int, t: int, tree: bool) -> bool:
        uses = self.uses[tree].get(p, [])
        i = bisect_left(uses, t)
        return i < len(uses) and self.cum[tree][uses[i]] - self.cum[tree][t] < self.distance


class _Replay:
    """The coordinator's state over one micro-batch: the parameter queue, what is gathered, which running modules
    hold each parameter (a parameter is freed only when none does)."""

    def __init__(self, tr: Trace, policy: Policy, frozen: bool) -> None:
        self.tr, self.policy, self.size = tr, policy, tr.sizes
        self.big = {p for p, n in enumerate(tr.sizes) if n > policy.persistence_threshold}
        self.frozen = {p for p in self.big if p not in tr.adapters} if frozen else set()
        self.reuse = _Reuse(tr.steps, tr.sizes, policy.max_reuse_distance)
        self.queue = deque((p, at) for at, st in enumerate(tr.steps) for p in st.fetch)
        self.fetched_for = dict.fromkeys(range(len(tr.sizes)), -1)
        self.live: set[int] = set()
        self.active: dict[int, set[int]] = {p: set() for p in range(len(tr.sizes))}
        self.attributed: dict[int, set[int]] = {}  # a backward step -> frozen parameters its recompute fetched
        self.inflight: dict[int, frozenset[int]] = {}  # a parameter gathered but not yet waited for -> its gather
        self.total = self.peak = self.peak_buffers = 0

    def fetch(self, t: int) -> None:
        st, q = self.tr.steps[t], self.queue
        new = {p for p in st.fetch if p in self.big and p not in self.live}
        popped, own = 0, {p for p in st.fetch if self.fetched_for[p] < t}
        while q and popped < len(own):  # this module's own entries leave the queue
            p, at = q.popleft()
            self.fetched_for[p], popped = at, popped + 1
        self.live |= new
        self._launch(new)
        self._wait(st.fetch)
        room, taken, prefetch = min(self.policy.max_live - self.gathered(), self.policy.prefetch_bucket), 0, set()
        while q and taken < room:
            p, at = q.popleft()
            self.fetched_for[p] = max(self.fetched_for[p], at)
            if p in self.big and p not in self.live:
                self.live.add(p)
                prefetch.add(p)
                taken += self.size[p]
        self._launch(prefetch)
        self.total += sum(self.size[p] for p in new | prefetch)
        self.peak = max(self.peak, self.gathered())
        for p in st.fetch:
            self.active[p].add(t)
        if t in self.tr.owner:
            held = {p for p in st.fetch if p in self.frozen}
            self.attributed.setdefault(self.tr.owner[t], set()).update(held)
            for p in held:
                self.active[p].add(self.tr.owner[t])

    def _launch(self, params: set[int]) -> None:
        group = frozenset(params)
        self.inflight.update(dict.fromkeys(params, group))

    def _wait(self, needed: tuple[int, ...]) -> None:
        """The module's parameters waited for: each in-flight group they are in is copied out of its flat buffer."""
        groups = {self.inflight[p] for p in needed if p in self.inflight}
        copying = sum(sum(self.size[p] for p in g) for g in groups if len(g) > 1)
        self.peak = max(self.peak, self.gathered())
        self.peak_buffers = max(self.peak_buffers, self.gathered() + copying)
        for g in groups:
            for p in g:
                del self.inflight[p]

    def release(self, r: int, t: int) -> None:
        """Module `r` done (after fetch `t`): its parameters freed unless used again soon (what its recompute
        fetched: freed regardless) or still held by a running module."""
        done, held = self.tr.steps[r], self.attributed.pop(r, set())
        free = {p for p in done.fetch if self.fetched_for[p] <= t + 1 and not self.reuse.soon(p, t + 1, done.leaf)}
        for p in set(done.fetch) | held:
            self.active[p].discard(r)
            if p in free | held and not self.active[p]:
                self.live.discard(p)

    def gathered(self) -> int:
        return sum(self.size[p] for p in self.live)


@lru_cache(maxsize=64)
def gathered(shape: ModelShape, ckpt_layers: int, lm_head: bool = True, policy: Policy = PLANNED,
             lora_rank: int = 0) -> Gathered:
    """Replay DeepSpeed's fetch, prefetch and release over one micro-batch's trace (memory/zero3_trace.py), as it
    runs once the trace is recorded (every micro-batch after the first two)."""
    tr = trace(shape, ckpt_layers, lm_head, lora_rank)
    replay = _Replay(tr, policy, frozen=lora_rank > 0)
    for t in range(len(tr.steps)):
        replay.fetch(t)
        for r in tr.releases[t]:
            replay.release(r, t)
    largest = max(sum(tr.sizes[p] for p in st.fetch if p in replay.big) for st in tr.steps)
    return Gathered(replay.peak, replay.total, largest, max(replay.peak, replay.peak_buffers))


def gather_elements(shape: ModelShape, ckpt_fraction: float, lm_head: bool = True, lora_rank: int = 0) -> Gathered:
    """The replay for a setup: `lora_rank` 0 for full training (no PEFT wrappers)."""
    return gathered(shape, round(ckpt_fraction * shape.layers), lm_head, PLANNED, lora_rank)
