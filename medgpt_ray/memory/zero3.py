"""ZeRO-3's gathered parameters: what DeepSpeed's parameter coordinator holds whole on a GPU while the model runs,
and how many elements it all-gathers per micro-batch (docs/ARCHITECTURE.md, "memory/").

DeepSpeed 0.19 (runtime/zero/partitioned_param_coordinator.py) gathers a module's own parameters before the module
runs (an nn.Linear's weight, an embedding, a MoE block's fused 3-D expert tensors, which are one module's two
parameters: ~604 M elements a layer for Qwen3-30B-A3B), then prefetches the next parameters of the recorded trace
while fewer than `stage3_prefetch_bucket_size` elements are in flight (the parameter that crosses the bucket is
taken whole) and fewer than `stage3_max_live_parameters` are gathered. After the module runs it frees them unless
they are used again within `stage3_max_reuse_distance` elements of the trace: at the turn from forward to
backward, the LM head and the last layers stay gathered. Parameters of at most `stage3_param_persistence_threshold`
elements (norms, biases, small gates) are never partitioned. With one rank nothing is copied (the gathered tensor
is a view of the partition) unless the partition lives on the CPU (parameter offload).

This module replays that policy on the trace of one micro-batch (forward; backward with the checkpointed layers'
recompute) built from the model's shape, and answers the most elements gathered at once and the elements gathered in
all. The values are the ones stage_plan.py writes into every ZeRO-3 DeepSpeed config (reuse distance: DeepSpeed's
default, which the config leaves).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

from medgpt_ray.memory.shapes import ModelShape

PREFETCH_BUCKET_ELEMENTS = 50_000_000  # stage3_prefetch_bucket_size
MAX_LIVE_ELEMENTS = 1_000_000_000  # stage3_max_live_parameters
PERSISTENCE_THRESHOLD = 100_000  # stage3_param_persistence_threshold
MAX_REUSE_DISTANCE = 1_000_000_000  # stage3_max_reuse_distance (DeepSpeed's default)

Module = tuple[int, ...]  # the ids of a module's own parameters


@dataclass(frozen=True)
class Gathered:
    peak_elements: int  # the most parameter elements gathered (whole) at once during a micro-batch
    per_micro_batch: int  # elements all-gathered during one micro-batch (forward, backward and recompute)
    largest_module: int  # the largest module's own partitioned parameters: the unit DeepSpeed gathers at once


def _layer(shape: ModelShape, i: int) -> list[list[int]]:
    """One decoder layer's modules in forward order, each as its parameters' element counts (the shape's
    `small_params`, norms, biases and convolutions, left out: they are within the persistence threshold)."""
    h = shape.hidden
    if i in shape.linear_layers:
        k = shape.linear_key_heads * shape.linear_key_head_dim
        v, nv = shape.linear_value_heads * shape.linear_value_head_dim, shape.linear_value_heads
        mixer = [[h * (2 * k + v)], [h * v], [h * nv], [h * nv], [v * h]]
    else:
        q = shape.q_dim * (2 if shape.q_gate else 1)
        mixer = [[h * q], [h * shape.kv_dim], [h * shape.kv_dim], [shape.q_dim * h]]
    if i in shape.moe_layers:
        si, e, mi = shape.shared_expert_intermediate, shape.experts, shape.moe_intermediate
        shared = [[h * si], [h * si], [si * h], [h]] if si else []  # the shared expert and its 1-output gate
        mlp = [[e * h], [e * 2 * mi * h, e * h * mi], *shared]
    elif shape.fused_gate_up:
        mlp = [[h * 2 * shape.intermediate], [shape.intermediate * h]]
    else:
        mlp = [[h * shape.intermediate], [h * shape.intermediate], [shape.intermediate * h]]
    return mixer + mlp


def _trace(shape: ModelShape, ckpt_layers: int, lm_head: bool) -> tuple[list[Module], list[int]]:
    """(the modules in the order DeepSpeed fetches them in one micro-batch, each parameter id's element count).
    A tied LM head is the embedding's parameter; the first `ckpt_layers` layers recompute their forward in backward
    (which layers recompute barely moves the peak: one layer is live at a time)."""
    sizes: list[int] = [shape.embedding_params]
    embed: Module = (0,)

    def ids(counts: list[int]) -> Module:
        sizes.extend(counts)
        return tuple(range(len(sizes) - len(counts), len(sizes)))

    layers = [[ids(m) for m in _layer(shape, i)] for i in range(shape.layers)]
    head: list[Module] = []
    if lm_head:
        head = [embed if shape.tied_embeddings else ids([shape.vocab * shape.hidden])]
    forward = [embed, *(m for layer in layers for m in layer), *head]
    backward = list(head)
    for i in reversed(range(shape.layers)):
        backward += (layers[i] if i < ckpt_layers else []) + layers[i][::-1]
    return forward + backward + [embed], sizes


@lru_cache(maxsize=64)
def gathered(shape: ModelShape, ckpt_layers: int, lm_head: bool = True) -> Gathered:
    """Replay DeepSpeed's fetch, prefetch and release over one micro-batch's trace (a complete trace: every
    micro-batch after the first)."""
    trace, size = _trace(shape, ckpt_layers, lm_head)
    big = {p for p, n in enumerate(size) if n > PERSISTENCE_THRESHOLD}
    # Reuse distance: elements of the modules between a release and the parameter's next use.
    cum = [0, *accumulate(sum(size[p] for p in m) for m in trace)]
    next_use: list[dict[int, int]] = [{} for _ in trace]
    upcoming: dict[int, int] = {}
    for step in reversed(range(len(trace))):
        next_use[step] = dict(upcoming)
        upcoming.update({p: step for p in trace[step]})
    queue = deque((p, step) for step, m in enumerate(trace) for p in m)
    fetched_for = dict.fromkeys(range(len(size)), -1)
    live: set[int] = set()
    peak = total = 0
    for step, module in enumerate(trace):
        new = [p for p in module if p in big and p not in live]
        own = {p for p in module if fetched_for[p] < step}
        popped = 0
        while queue and popped < len(own):  # this module's own entries leave the queue
            p, at = queue.popleft()
            fetched_for[p], popped = at, popped + 1
        live_now = sum(size[p] for p in live) + sum(size[p] for p in new)
        room, taken, prefetch = min(MAX_LIVE_ELEMENTS - live_now, PREFETCH_BUCKET_ELEMENTS), 0, []
        while queue and taken < room:
            p, at = queue.popleft()
            fetched_for[p] = max(fetched_for[p], at)
            if p in big and p not in live and p not in new and p not in prefetch:
                prefetch.append(p)
                taken += size[p]
        live.update(new + prefetch)
        total += sum(size[p] for p in new + prefetch)
        peak = max(peak, sum(size[p] for p in live))
        for p in module:  # released after the module ran, unless used again soon
            later = next_use[step].get(p)
            soon = later is not None and cum[later] - cum[step + 1] < MAX_REUSE_DISTANCE
            if p in live and not soon and fetched_for[p] <= step + 1:
                live.discard(p)
    largest = max(sum(size[p] for p in m if p in big) for m in trace)
    return Gathered(peak, total, largest)


def gather_elements(shape: ModelShape, ckpt_fraction: float, lm_head: bool = True) -> Gathered:
    return gathered(shape, round(ckpt_fraction * shape.layers), lm_head)
