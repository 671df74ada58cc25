"""The shape of a decoder: the parameter counts the memory and throughput models need (exact against the model
transformers builds from the same config.json: tests/unit/test_shape_families.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# bitsandbytes NF4 with double quantization: 4 bits + an 8-bit absmax per 64 weights + an fp32 absmax per 256 blocks
# (the bytes a 4-bit linear weight is held in: QLoRA's base, opd's 4-bit teacher).
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)


@dataclass(frozen=True)
class ModelShape:
    """A decoder's architecture. The fields after `qkv_bias` default to a dense Qwen2/Llama decoder (head_dim 0:
    hidden / heads); the families' own settings (memory/families.py) fill them from a config.json."""

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied_embeddings: bool
    qkv_bias: bool = True  # Qwen2 has q/k/v biases; Llama has none
    head_dim: int = 0  # 0: hidden // heads (Qwen3 and Qwen3.5 set their own)
    o_bias: bool = False  # a bias on o_proj (Llama's and Qwen3's attention_bias)
    mlp_bias: bool = False  # Llama's mlp_bias
    qk_norm: bool = False  # Qwen3's per-head RMSNorm of q and k
    q_gate: bool = False  # Qwen3.5's attention: q_proj also projects an output gate (twice the width)
    norms_per_layer: int = 2  # GLM-4 has 4 (post-attention and post-MLP norms)
    fused_gate_up: bool = False  # GLM-4: one gate_up_proj Linear (h -> 2i), not two (LoRA adapts one)
    # Hybrid layers (Qwen3.5): which layers are Gated-DeltaNet linear attention, and its dimensions.
    linear_layers: tuple[int, ...] = ()
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    # Mixture of experts: which layers route (the others keep the dense MLP of `intermediate`).
    moe_layers: tuple[int, ...] = ()
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    shared_expert_intermediate: int = 0  # with its own 1-output gate (Qwen2-MoE, Qwen3.5-MoE)
    # PEFT 0.21's `all-linear` on this family wraps the fused experts and the router, and the attention's q/k/v/o
    # only (Qwen3-MoE; not Qwen2-MoE or Qwen3.5-MoE, where it adapts every nn.Linear and no expert): measured in
    # tests/unit/test_shape_families.py. Which targets a MoE should train: issue 34 item 2.
    lora_adapts_experts: bool = False

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    def _attention_linears(self) -> list[tuple[int, int]]:
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        return [(h, q * (2 if self.q_gate else 1)), (h, kv), (h, kv), (q, h)]

    def _linear_attention_linears(self) -> list[tuple[int, int]]:
        h, nv = self.hidden, self.linear_value_heads
        k, v = self.linear_key_heads * self.linear_key_head_dim, nv * self.linear_value_head_dim
        return [(h, 2 * k + v), (h, v), (h, nv), (h, nv), (v, h)]

    def _mlp_linears(self, inter: int, fused: bool = False) -> list[tuple[int, int]]:
        h = self.hidden
        return [(h, 2 * inter), (inter, h)] if fused else [(h, inter), (h, inter), (inter, h)]

    def _moe_linears(self) -> list[tuple[int, int]]:
        si = self.shared_expert_intermediate
        return [*self._mlp_linears(si), (self.hidden, 1)] if si else []

    def _layer_linears(self) -> list[tuple[int, list[tuple[int, int]]]]:
        """(how many layers, the (in, out) of each nn.Linear) for each kind of mixer and of MLP."""
        n_lin, n_moe = len(self.linear_layers), len(self.moe_layers)
        return [(self.layers - n_lin, self._attention_linears()), (n_lin, self._linear_attention_linears()),
                (self.layers - n_moe, self._mlp_linears(self.intermediate, self.fused_gate_up)),
                (n_moe, self._moe_linears())]

    @property
    def linear_params(self) -> int:
        """The weights of the decoder layers' nn.Linear projections: what LoRA adapts and 4-bit quantizes (the
        experts' fused 3-D parameters are not nn.Linear: bitsandbytes leaves them in 16 bits)."""
        return sum(n * sum(a * b for a, b in lins) for n, lins in self._layer_linears())

    @property
    def small_params(self) -> int:
        """Norms, biases and the linear-attention layers' convolution and decay: tiny, kept in 16 bits."""
        h, hd = self.hidden, self.head_dim
        attn = (self.q_dim * (2 if self.q_gate else 1) + 2 * self.kv_dim if self.qkv_bias else 0)
        attn += (h if self.o_bias else 0) + (2 * hd if self.qk_norm else 0)
        nv = self.linear_value_heads
        conv = (2 * self.linear_key_heads * self.linear_key_head_dim + nv * self.linear_value_head_dim)
        linear = conv * self.linear_conv_kernel + 2 * nv + self.linear_value_head_dim
        n_lin, n_moe = len(self.linear_layers), len(self.moe_layers)
        mlp = (2 * self.intermediate + h) if self.mlp_bias else 0
        return ((self.layers - n_lin) * attn + n_lin * linear + (self.layers - n_moe) * mlp
                + self.layers * self.norms_per_layer * h + h)

    @property
    def expert_params(self) -> int:
        """Every expert's weights (fused 3-D parameters, not nn.Linear): all of them are held, a few run."""
        return len(self.moe_layers) * self.experts * 3 * self.hidden * self.moe_intermediate

    @property
    def router_params(self) -> int:
        """The routers' weights (a parameter, not nn.Linear: never 4-bit)."""
        return len(self.moe_layers) * self.experts * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Every parameter: what is held in memory (a MoE's idle experts too)."""
        return (self.linear_params + self.small_params + self.expert_params + self.router_params
                + self.embedding_params + self.head_params)

    @property
    def active_params(self) -> int:
        """What one token runs through: the routed experts only (equal to `params` for a dense model)."""
        idle = self.experts - self.experts_per_token
        return self.params - len(self.moe_layers) * idle * 3 * self.hidden * self.moe_intermediate

    def lora_params(self, rank: int) -> int:
        """PEFT `all-linear`: A (r x in) and B (out x r) on every nn.Linear of every layer; where it also wraps the
        experts' fused parameters (gate_up at rank 2r per expert, down at r per expert) and the router, those too."""
        groups = self._layer_linears()
        if not self.lora_adapts_experts:
            return sum(n * sum(rank * (a + b) for a, b in lins) for n, lins in groups)
        # There PEFT turns `all-linear` into q/k/v/o modules and the expert and router parameters: a dense MLP
        # layer's projections (mlp_only_layers, decoder_sparse_step) are left out.
        dense = sum(n * sum(rank * (a + b) for a, b in lins) for n, lins in groups[:2])
        h, e, mi = self.hidden, self.experts, self.moe_intermediate
        moe = 2 * rank * e * (h + 2 * mi) + rank * e * (mi + h) + rank * (h + e)
        return dense + len(self.moe_layers) * moe

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "params": self.params, "active_params": self.active_params}


class ShapeError(ValueError):
    pass
