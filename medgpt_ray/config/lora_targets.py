"""What `lora.targets: all-linear` (the default) adapts on a mixture-of-experts model: the planner counts it
(memory/shape_model.py) and models.lora_config hands it to PEFT, from this one table (docs/ARCHITECTURE.md,
"In transition": model families).

PEFT 0.21's own `all-linear` is not what a MoE should train: on Qwen3-MoE it wraps the fused 3-D experts and the
router (and then refuses any lora_dropout), on Qwen2-MoE and Qwen3.5-MoE it adapts the shared expert's 1-output
gate. So on a MoE `all-linear` means, explicitly: the attention projections (and Qwen3.5's linear-attention ones),
the dense MLP layers' and the shared expert's projections; the routers and the shared-expert gates stay frozen, and
so do the routed experts (fused parameters, not nn.Linear). A dense model keeps PEFT's `all-linear` as it is."""

from __future__ import annotations

ALL_LINEAR = "all-linear"
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
LINEAR_ATTENTION = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")  # Qwen3.5's Gated DeltaNet
MLP = ("gate_proj", "up_proj", "down_proj")  # a dense MLP layer's, and the shared expert's (`mlp.shared_expert.*`)

# model_type (of the text model) -> the nn.Linear names `all-linear` adapts. PEFT matches a name on the last
# components of a module's path: `gate_proj` is not the router `gate` nor `shared_expert_gate`.
MOE_LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "qwen2_moe": ATTENTION + MLP,
    # Attention only: PEFT 0.21 maps the names gate_proj/up_proj/down_proj on Qwen3-MoE onto the fused experts (its
    # conversion of transformers-v4 adapters), so a Qwen3-MoE's dense MLP layers (mlp_only_layers) stay frozen.
    "qwen3_moe": ATTENTION,
    "qwen3_5_moe_text": ATTENTION + LINEAR_ATTENTION + MLP,
}


def resolve_lora_targets(targets: str | list[str], model_type: str | None) -> str | list[str]:
    """The targets PEFT is given: `all-linear` on a MoE family becomes its explicit list; anything else as set."""
    if isinstance(targets, str) and targets.lower() == ALL_LINEAR and model_type in MOE_LORA_TARGETS:
        return list(MOE_LORA_TARGETS[model_type])
    return targets


# `lora.experts`: the routed experts' fused 3-D parameters, adapted by PEFT's ParamWrapper (`target_parameters`,
# matched on the end of a parameter's name). PEFT gives each of the E experts its own rank-r pair: lora_A is
# (r*E x in), lora_B (out x r*E) on each tensor (memory/shape_model.py counts it). The router (`mlp.gate.weight`)
# is never listed: it stays frozen.
EXPERT_PARAMETERS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def expert_parameters(experts: bool, model_type: str | None) -> list[str] | None:
    """PEFT's `target_parameters` for `lora.experts` (None: off); a model without routed experts is refused."""
    if not experts:
        return None
    if model_type not in MOE_LORA_TARGETS:
        raise ValueError(f"lora.experts: the model ({model_type}) has no routed experts; it applies to "
                         f"{', '.join(MOE_LORA_TARGETS)}")
    return list(EXPERT_PARAMETERS)
