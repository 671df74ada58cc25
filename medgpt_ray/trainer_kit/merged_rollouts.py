"""Rollouts from the LoRA adapter merged into the base: trainer behaviours for TRL's GRPOTrainer and RLOOTrainer (the
grpo and rloo kinds: MergedRollouts) and GKDTrainer (opd's student samples: MergedStudentSamples).

An unmerged adapter costs every decode step two small matmuls and PEFT's Python per adapted layer: on the H200 a
1.5B policy with LoRA on all linear layers decoded 16 sequences at 126 tokens/s unmerged and 436 merged, 64 at 627
and 2,256 (issue 35's probe, transformers 5.17). So each generate call runs on the merged weights: PEFT's own merge
(`LoraLayer.merge`, which handles its variants) before, PEFT's unmerge after, and then every merged base tensor is
written back from a host copy taken once: a bf16 merge and unmerge does not round-trip (W + d - d != W), and the
frozen base must stay bit-identical (tests/stages/test_rollout_weights.py). The copy is taken when the first rollout
starts (the base is frozen, so it never goes stale); its host RAM is the adapted layers' weights (memory/generation.py
rollout_path says so in the plan). The GPU holds one layer's delta at a time beyond the model.

Not merged (the plan names why): a QLoRA base (4-bit: a merge would dequantize and requantize it, changing it), a
ZeRO-3 policy (its weights are partitions outside the generate call's gather), full training (no adapter). With
lora.experts, the routed experts' adapters where the worker's host RAM cannot hold the experts' copy (the plan says
so: memory/rollout_host.py); the dense layers' still merge."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from medgpt_ray.memory.rollout_host import EXPERTS_UNMERGED


def lora_layers(model: Any, experts: bool = True) -> dict[str, Any]:
    """PEFT's LoRA layers of `model` by module name, those with an adapter to merge; without `experts`, not the
    adapters on parameters (PEFT's ParamWrapper: lora.experts' fused expert tensors)."""
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer) and m.active_adapters
            and (experts or not getattr(m, "parameter_name", None))}


def base_tensors(layer: Any) -> dict[str, Any]:
    """What a merge writes: the base layer's weight, and its bias where it has one; for an adapter on a parameter
    (PEFT's ParamWrapper: lora.experts' fused expert tensors) that parameter."""
    base = layer.get_base_layer()
    if getattr(layer, "parameter_name", None):
        return {layer.parameter_name: getattr(base, layer.parameter_name)}
    return {"weight": base.weight} | ({"bias": base.bias} if getattr(base, "bias", None) is not None else {})


def host_copy(layers: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """The base tensors of `layers` on the host (pinned where they live on a GPU, for a fast copy back)."""
    copies = {}
    for name, layer in layers.items():
        for part, tensor in base_tensors(layer).items():
            copy = tensor.detach().to("cpu", copy=True)
            copies[(name, part)] = copy.pin_memory() if tensor.is_cuda else copy
    return copies


@contextmanager
def merged_adapters(layers: dict[str, Any], base: dict[tuple[str, str], Any]) -> Iterator[None]:
    """`layers` merged for the block; afterwards unmerged and their base tensors bit-identical to `base` again."""
    import torch

    with torch.no_grad():
        for layer in layers.values():
            layer.merge()
    try:
        yield
    finally:
        with torch.no_grad():
            for name, layer in layers.items():
                if layer.merged:
                    layer.unmerge()
                for part, tensor in base_tensors(layer).items():
                    tensor.data.copy_(base[(name, part)], non_blocking=True)
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the copies land before the training forward reads the weights


class _MergedWhileGenerating:
    """The adapted layers and their base's host copy, found and taken at the first generate call; `merge_experts`
    False (merging_behaviour): lora.experts' adapters stay unmerged, their experts are not copied."""

    merge_experts = True

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._merged_layers: dict[str, Any] | None = None
        self._base_copy: dict[tuple[str, str], Any] = {}
        self.merge_seconds = 0.0  # merging and writing the base back, every rollout (result.json's rollout_merge_s)

    @contextmanager
    def _merged(self) -> Iterator[None]:
        import time

        import torch

        if self._merged_layers is None:
            self._merged_layers = lora_layers(self.model, self.merge_experts)
            self._base_copy = host_copy(self._merged_layers)
        t0 = time.perf_counter()
        with merged_adapters(self._merged_layers, self._base_copy):
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the merge's kernels counted here, not in the generate call
            self.merge_seconds += time.perf_counter() - t0
            yield  # a failed rollout still writes the base back (merged_adapters); its timing does not matter
            t1 = time.perf_counter()
        self.merge_seconds += time.perf_counter() - t1  # the write-back (it synchronizes)


class MergedRollouts(_MergedWhileGenerating):
    """Each generate call of GRPO's or RLOO's trainer (TRL's `_generate_single_turn`) on the merged weights."""

    def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
        with self._merged():
            return super()._generate_single_turn(*args, **kwargs)


class MergedStudentSamples(_MergedWhileGenerating):
    """Each of GKD's student generate calls (TRL's `generate_on_policy_outputs`) on the merged weights."""

    def generate_on_policy_outputs(self, *args: Any, **kwargs: Any) -> Any:
        with self._merged():
            return super().generate_on_policy_outputs(*args, **kwargs)


def merging_behaviour(rollout: str | None, behaviour: type) -> tuple[type, ...]:
    """The trainer behaviours that merge for the plan's `rollout` (memory/generation.py rollout_line): none where it
    does not merge; `behaviour` without the experts where the plan keeps them unmerged (no host RAM for their copy:
    memory/rollout_host.py)."""
    if not (rollout or "").startswith("merged"):
        return ()
    if EXPERTS_UNMERGED in (rollout or ""):
        return (type(f"{behaviour.__name__}WithoutExperts", (behaviour,), {"merge_experts": False}),)
    return (behaviour,)
