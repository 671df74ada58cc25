"""`lora.experts`: LoRA on a MoE's routed experts through PEFT's `target_parameters` (config/lora_targets.py), what
it holds on the GPU beyond its adapters, and where the planner refuses it.

PEFT 0.21's ParamWrapper does not run the adapter beside the expert matmul as lora.Linear does: on every forward of
a routed layer it folds the update into a new tensor, W + s * B @ A (one `baddbmm` per fused tensor, in the weights'
dtype), and the experts run on that. So per routed layer a copy of the layer's whole expert weights (every expert,
not the active ones) exists while the layer runs; the expert matmul saves it for backward (the input gradient needs
it) and backward produces its gradient, a tensor of the same size, before reducing it to the adapters' gradients.

  - a layer that is not checkpointed keeps its copy from its forward to its backward;
  - the layer in backward adds the copy's gradient; a checkpointed one rebuilds its copy first.

Checked on CPU against torch's MemTracker over a real forward and backward of a tiny Qwen3-MoE
(tests/unit/test_expert_lora_memory.py): with transformers' default `grouped_mm` experts this term and the adapters'
weights exceed the traced extra by 7-33 % (2-4 layers, 16-32 experts, with and without checkpointing; the traced
one holds some of the adapters' gradients too). With every layer checkpointed the trace held ~1.2-1.5 copies where
two are counted. Unmeasured on a GPU."""

from __future__ import annotations

from medgpt_ray.config import ConfigError, StageConfig
from medgpt_ray.memory.setup import TrainSetup
from medgpt_ray.memory.shapes import ModelShape


def expert_copies(shape: ModelShape, s: TrainSetup) -> int:
    """How many copies of one routed layer's expert weights are alive at the backward's start: one per routed layer
    that is not checkpointed, and the gradient of the layer being back-propagated (or, with every routed layer
    checkpointed, the rebuilt copy and its gradient)."""
    if not (s.lora_experts and s.method != "full" and shape.moe_layers):
        return 0
    first_live = round(s.ckpt_fraction * shape.layers)  # the first ones are checkpointed (activations.py)
    live = sum(1 for i in shape.moe_layers if i >= first_live)
    return max(live + 1, 2)


def expert_lora_terms(shape: ModelShape, s: TrainSetup) -> dict[str, float]:
    """The estimator's term for the folded expert weights (empty without `lora.experts`). The adapters' own weights,
    gradients and optimizer states are in the trainable count (ModelShape.lora_params)."""
    copies = expert_copies(shape, s)
    if not copies:
        return {}
    e = 4 if s.precision == "fp32" else 2  # the experts' dtype: 16-bit also under QLoRA (bitsandbytes skips them)
    return {"expert_lora_fold": copies * e * shape.expert_layer_params}


def check_expert_lora(where: str, cfg: StageConfig, shape: ModelShape) -> None:
    """Refuse `lora.experts` where it cannot run: a model without routed experts, full training, ZeRO-3 (PEFT folds
    the update into a parameter that ZeRO-3 has partitioned away: its parametrization is not gathered by
    DeepSpeed's hooks, unvalidated here)."""
    if not cfg.lora.experts:
        return
    if not shape.moe_layers:
        raise ConfigError(f"{where}.lora.experts: {shape.name} has no routed experts (not a qwen2_moe, qwen3_moe or "
                          f"qwen3_5_moe model); remove the key")
    if cfg.method == "full":
        raise ConfigError(f"{where}.lora.experts: method 'full' trains the experts already; it applies to lora and "
                          f"qlora")
    if cfg.zero_stage == 3 or cfg.offload == "all":
        raise ConfigError(f"{where}.lora.experts: not with zero_stage 3 or offload 'all' (PEFT's expert adapters "
                          f"fold into the partitioned expert weights, unvalidated under ZeRO-3); use zero_stage 0, 1 "
                          f"or 2")
