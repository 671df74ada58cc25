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
    # The nn.Linear names LoRA adapts: () is PEFT's `all-linear` (every one), a MoE family's list otherwise
    # (config/lora_targets.py: attention, dense and shared-expert MLPs; never the routers, gates or routed experts).
    lora_targets: tuple[str, ...] = ()
    # liger-kernel's coverage of the family (memory/families.py LIGER): its layer kernels, its fused linear CE, its
    # RoPE (part of the layer kernels where the family takes it).
    liger_layers: bool = True
    liger_fused_ce: bool = True
    liger_rope: bool = True

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    def attention_linears(self) -> list[tuple[str, int, int]]:
        """(name, in, out) of a full-attention layer's nn.Linear projections."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        return [("q_proj", h, q * (2 if self.q_gate else 1)), ("k_proj", h, kv), ("v_proj", h, kv), ("o_proj", q, h)]

    def linear_attention_linears(self) -> list[tuple[str, int, int]]:
        """A Gated-DeltaNet layer's: q, k and v in one projection, its output gate z, beta's b and the decay's a."""
        h, nv = self.hidden, self.linear_value_heads
        k, v = self.linear_key_dim, self.linear_value_dim
        return [("in_proj_qkv", h, 2 * k + v), ("in_proj_z", h, v), ("in_proj_b", h, nv), ("in_proj_a", h, nv),
                ("out_proj", v, h)]

    def mlp_linears(self, moe: bool = False) -> list[tuple[str, int, int]]:
        """A dense MLP layer's, or a routed layer's nn.Linears: its shared expert's and that expert's 1-output gate
        (the routed experts are fused 3-D parameters, the router a parameter: neither is nn.Linear)."""
        h = self.hidden
        if moe:
            si = self.shared_expert_intermediate
            return [*self._swiglu(si), ("shared_expert_gate", h, 1)] if si else []
        if self.fused_gate_up:
            return [("gate_up_proj", h, 2 * self.intermediate), ("down_proj", self.intermediate, h)]
        return self._swiglu(self.intermediate)

    def _swiglu(self, inter: int) -> list[tuple[str, int, int]]:
        h = self.hidden
        return [("gate_proj", h, inter), ("up_proj", h, inter), ("down_proj", inter, h)]

    def lora_adapted(self, linears: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
        """Those of `linears` LoRA adapts (all of them under PEFT's `all-linear`)."""
        return [lin for lin in linears if not self.lora_targets or lin[0] in self.lora_targets]

    @property
    def linear_key_dim(self) -> int:
        return self.linear_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_value_heads * self.linear_value_head_dim

    @property
    def attention_layers(self) -> int:
        """Full-attention layers: those that hold a KV cache (a hybrid's linear-attention layers hold a state)."""
        return self.layers - len(self.linear_layers)

    @property
    def routed_width(self) -> int:
        """The MLP width one token runs through in a routed layer: its active experts' and the shared expert's."""
        return self.experts_per_token * self.moe_intermediate + self.shared_expert_intermediate

    @property
    def mlp_width(self) -> int:
        """The widest MLP a token runs through: the dense layers' `intermediate`, a routed layer's active width."""
        dense = self.layers - len(self.moe_layers)
        return max([self.intermediate] * bool(dense) + [self.routed_width] * bool(self.moe_layers))

    def _layer_linears(self) -> list[tuple[int, list[tuple[str, int, int]]]]:
        """(how many layers, the (name, in, out) of each nn.Linear) for each kind of mixer and of MLP."""
        n_lin, n_moe = len(self.linear_layers), len(self.moe_layers)
        return [(self.layers - n_lin, self.attention_linears()), (n_lin, self.linear_attention_linears()),
                (self.layers - n_moe, self.mlp_linears()), (n_moe, self.mlp_linears(moe=True))]

    @property
    def linear_params(self) -> int:
        """The weights of the decoder layers' nn.Linear projections: what LoRA adapts and 4-bit quantizes (the
        experts' fused 3-D parameters are not nn.Linear: bitsandbytes leaves them in 16 bits)."""
        return sum(n * sum(a * b for _, a, b in lins) for n, lins in self._layer_linears())

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

    def lora_params(self, rank: int, experts: bool = False) -> int:
        """LoRA's trainable weights: A (r x in) and B (out x r) on every adapted nn.Linear of every layer (PEFT's
        `all-linear`, or the MoE family's explicit targets: config/lora_targets.py); with `experts` (lora.experts)
        the routed experts' adapters too."""
        linears = sum(n * sum(rank * (a + b) for _, a, b in self.lora_adapted(lins))
                      for n, lins in self._layer_linears())
        return linears + (self.expert_lora_params(rank) if experts else 0)

    def lora_base_params(self) -> int:
        """The weights and biases of the nn.Linears LoRA adapts: what merged rollouts copy to the host
        (memory/rollout_host.py)."""
        def bias(name: str) -> bool:
            return ((self.qkv_bias and name in ("q_proj", "k_proj", "v_proj")) or (self.o_bias and name == "o_proj")
                    or (self.mlp_bias and name in ("gate_proj", "up_proj", "down_proj")))

        return sum(n * sum(a * b + (b if bias(name) else 0) for name, a, b in self.lora_adapted(lins))
                   for n, lins in self._layer_linears())

    def expert_lora_params(self, rank: int) -> int:
        """`lora.experts`' adapters: PEFT's ParamWrapper gives each expert its own rank-r pair on each fused tensor,
        gate_up (h -> 2 x moe_intermediate) and down (moe_intermediate -> h): r x E x (in + out) per tensor."""
        h, mi = self.hidden, self.moe_intermediate
        return len(self.moe_layers) * rank * self.experts * ((h + 2 * mi) + (mi + h))

    @property
    def expert_layer_params(self) -> int:
        """One routed layer's expert weights (the fused gate_up and down tensors): what PEFT's expert adapter folds
        its update into on every forward (memory/expert_lora.py)."""
        return self.experts * 3 * self.hidden * self.moe_intermediate

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "params": self.params, "active_params": self.active_params}


class ShapeError(ValueError):
    pass
