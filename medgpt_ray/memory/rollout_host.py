"""The host RAM of merged rollouts (trainer_kit/merged_rollouts.py): each worker keeps a host copy of every base
tensor its LoRA adapters merge into, taken at the first rollout and kept for the run, so the frozen base is written
back bit-exact after each merge. With `lora.experts` that is every routed expert's weights too (the 8-layer
Qwen3-MoE of bench/family_models.py: ~9 GiB per worker; a 30B-A3B's 48 layers: ~54 GiB). Where the plan knows the
host RAM a worker has and the experts' copy does not fit in it, the routed experts' adapters stay unmerged for the
rollouts (the dense layers' still merge) and the plan's rollout line says so, with the numbers."""

from __future__ import annotations

from medgpt_ray.memory.budget import Budget
from medgpt_ray.memory.setup import GIB, Estimate, TrainSetup
from medgpt_ray.memory.shapes import ModelShape

# In plan.json's `rollout` where the routed experts' adapters are not merged; the kinds read it (merged_rollouts.py).
EXPERTS_UNMERGED = "the routed experts' adapters unmerged"


def host_copy_bytes(shape: ModelShape, s: TrainSetup, experts: bool | None = None) -> float:
    """One worker's host copy: the weight (and bias) of every adapted nn.Linear, and with `lora.experts` merged (or
    `experts` True) the routed experts' fused tensors, in the model's dtype (models.torch_dtype: bf16 only under
    precision bf16)."""
    e = 2 if s.precision == "bf16" else 4
    with_experts = (s.lora_experts and s.merge_experts) if experts is None else experts
    return e * (shape.lora_base_params() + (shape.expert_params if with_experts else 0))


def host_room_gib(budget: Budget, s: TrainSetup, est: Estimate) -> float | None:
    """Host RAM one worker has for the copy; None where the plan does not know it. On a GPU node: the share of the
    node's RAM the planner lets a run take (budget.host_usable_gib) less CPU offload's, split between the node's
    workers; on a CPU run: the worker's RAM less the training peak (the model lives in the same RAM)."""
    if budget.gpu_gib is None:
        return None if budget.cpu_ram_gib is None else budget.cpu_ram_gib - est.peak_gib
    if budget.host_gib is None:
        return None
    per_node = budget.workers_per_node(s.gpus)
    return (budget.host_usable_gib - est.host_gib * per_node) / per_node


def experts_fit_merged(shape: ModelShape, s: TrainSetup, room_gib: float | None) -> bool:
    """False where merged rollouts with `lora.experts` would copy more than the worker's host RAM (unknown: True)."""
    if room_gib is None or not s.lora_experts:
        return True
    return host_copy_bytes(shape, s, experts=True) / GIB <= room_gib


def host_note(shape: ModelShape, s: TrainSetup, room_gib: float | None) -> str:
    """The rollout line's host RAM clause, for rollouts that merge."""
    copy = host_copy_bytes(shape, s) / GIB
    room = "host RAM not known here: not checked" if room_gib is None else f"of {room_gib:.2f} GiB a worker has"
    note = f"; host RAM: {copy:.2f} GiB per worker for the base's copy ({room})"
    if s.lora_experts and not s.merge_experts:
        full = host_copy_bytes(shape, s, experts=True) / GIB
        note += f"; merging the experts too would copy {full:.2f} GiB per worker, more than that"
    return note
