"""config.json -> ModelShape for the decoder families we count exactly, each from its modeling file in the pinned
transformers (models/<family>/modeling_*.py). A setting absent from config.json takes the family's config-class
default, as transformers does; an unknown model_type, or a value the family's counting does not know (a new layer
type), is refused with the field named: never guessed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from medgpt_ray.config.lora_targets import MOE_LORA_TARGETS
from medgpt_ray.memory.shape_model import ModelShape, ShapeError

Settings = dict[str, Any]
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
POSITIVE = (*REQUIRED, "intermediate_size", "num_key_value_heads", "head_dim", "moe_intermediate_size",
            "shared_expert_intermediate_size", "num_experts", "num_local_experts", "num_experts_per_tok",
            "decoder_sparse_step",
            "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim", "full_attention_interval")
ATTENTION_TYPES = ("full_attention", "sliding_attention")
HYBRID_TYPES = ("full_attention", "linear_attention")
# A composite (vision-language) config.json's text model, which AutoModelForCausalLM builds from it.
TEXT_TYPES = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}


class Reader:
    """One config.json's text settings: `get` takes the family's default where the key is absent (or null)."""

    def __init__(self, text: Settings, source: str) -> None:
        self.text, self.source = text, source

    def get(self, key: str, default: Any = None) -> Any:
        value = self.text.get(key)
        return default if value is None else value

    def need(self, key: str) -> int:
        if self.text.get(key) is None:
            raise ShapeError(f"{self.source}: no {key!r}; not a decoder-only transformer config")
        return int(self.text[key])

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise ShapeError(f"{self.source}: {key} is {value!r}; expected true or false")
        return value

    def refuse(self, key: str, value: Any, known: str) -> ShapeError:
        return ShapeError(f"{self.source}: {key} is {value!r}; the shape counts only {known} (refused, not guessed)")

    def layer_types(self, known: tuple[str, ...], default: list[str]) -> list[str]:
        types = self.get("layer_types", default)
        layers = self.need("num_hidden_layers")
        if not isinstance(types, list) or len(types) != layers:
            raise ShapeError(f"{self.source}: layer_types is {types!r}; expected a list of {layers} layer types")
        for t in types:
            if t not in known:
                raise self.refuse("layer_types", t, f"the layer types {', '.join(known)}")
        return types


def _validate(text: Settings, source: str) -> None:
    for key in POSITIVE:
        value = text.get(key)
        if key in text and value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ShapeError(f"{source}: {key} is {value!r}; expected a positive integer")


def _base(r: Reader, name: str, kv_default: int | None, head_dim: int | None, tie: bool) -> Settings:
    """The settings every family shares; num_key_value_heads absent: the config class's default, null (or a class
    default of None): the attention heads, as the config classes' __post_init__ do."""
    heads = r.need("num_attention_heads")
    kv = r.text.get("num_key_value_heads", kv_default)
    return dict(name=name, vocab=r.need("vocab_size"), hidden=r.need("hidden_size"),
                layers=r.need("num_hidden_layers"), heads=heads, kv_heads=int(kv or heads),
                head_dim=int(r.get("head_dim", head_dim or 0)), tied_embeddings=tie)


def _attention_only(r: Reader) -> None:
    if "layer_types" in r.text:
        r.layer_types(ATTENTION_TYPES, [])


def _qwen2(r: Reader) -> Settings:
    _attention_only(r)
    return dict(intermediate=r.need("intermediate_size"), qkv_bias=True)


def _llama(r: Reader) -> Settings:
    bias = r.flag("attention_bias", False)
    return dict(intermediate=r.need("intermediate_size"), qkv_bias=bias, o_bias=bias,
                mlp_bias=r.flag("mlp_bias", False))


def _mistral(r: Reader) -> Settings:
    return dict(intermediate=r.need("intermediate_size"), qkv_bias=False)


def _glm4(r: Reader) -> Settings:
    return dict(intermediate=r.need("intermediate_size"), qkv_bias=r.flag("attention_bias", True), norms_per_layer=4,
                fused_gate_up=True)


def _qwen3(r: Reader) -> Settings:
    _attention_only(r)
    bias = r.flag("attention_bias", False)
    return dict(intermediate=r.need("intermediate_size"), qkv_bias=bias, o_bias=bias, qk_norm=True)


def _experts(r: Reader, default_experts: int, default_k: int, default_mi: int, shared: int) -> Settings:
    layers, step = r.need("num_hidden_layers"), int(r.get("decoder_sparse_step", 1))
    dense = r.get("mlp_only_layers", [])
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise ShapeError(f"{r.source}: mlp_only_layers is {dense!r}; expected a list of layer indices")
    # Qwen3MoeConfig writes num_experts as num_local_experts (its attribute_map); the hub's files say num_experts.
    experts = int(r.get("num_local_experts", r.get("num_experts", default_experts)))
    moe = tuple(i for i in range(layers) if i not in dense and experts > 0 and (i + 1) % step == 0)
    return dict(moe_layers=moe, experts=experts, experts_per_token=int(r.get("num_experts_per_tok", default_k)),
                moe_intermediate=int(r.get("moe_intermediate_size", default_mi)),
                shared_expert_intermediate=int(r.get("shared_expert_intermediate_size", shared)))


def _routed_width(s: Settings) -> int:
    """The MLP width a token runs through in a routed layer: its experts' and the shared expert's."""
    return s["experts_per_token"] * s["moe_intermediate"] + s["shared_expert_intermediate"]


def _qwen2_moe(r: Reader) -> Settings:
    _attention_only(r)
    s = _experts(r, 60, 4, 1408, 5632)
    return dict(s, intermediate=int(r.get("intermediate_size", 5632)), qkv_bias=r.flag("qkv_bias", True))


def _qwen3_moe(r: Reader) -> Settings:
    s = _qwen3_moe_attention(r)
    return dict(s, **_experts(r, 128, 8, 768, 0), intermediate=int(r.get("intermediate_size", 6144)))


def _qwen3_moe_attention(r: Reader) -> Settings:
    _attention_only(r)
    bias = r.flag("attention_bias", False)
    return dict(qkv_bias=bias, o_bias=bias, qk_norm=True)


def _hybrid(r: Reader) -> Settings:
    """Qwen3.5's text model: Gated-DeltaNet linear attention on the layers layer_types names, gated full attention
    (q_proj twice as wide, q/k norms) on the others."""
    layers = r.need("num_hidden_layers")
    interval = int(r.get("full_attention_interval", 4))
    default = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    types = r.layer_types(HYBRID_TYPES, default)
    bias = r.flag("attention_bias", False)
    return dict(qkv_bias=bias, o_bias=bias, qk_norm=True, q_gate=True,
                linear_layers=tuple(i for i, t in enumerate(types) if t == "linear_attention"),
                linear_key_heads=int(r.get("linear_num_key_heads", 16)),
                linear_value_heads=int(r.get("linear_num_value_heads", 32)),
                linear_key_head_dim=int(r.get("linear_key_head_dim", 128)),
                linear_value_head_dim=int(r.get("linear_value_head_dim", 128)),
                linear_conv_kernel=int(r.get("linear_conv_kernel_dim", 4)))


def _qwen3_5_text(r: Reader) -> Settings:
    return dict(_hybrid(r), intermediate=r.need("intermediate_size"))


def _qwen3_5_moe_text(r: Reader) -> Settings:
    s = dict(_hybrid(r), experts=int(r.get("num_experts", 256)), experts_per_token=int(r.get("num_experts_per_tok", 8)),
             moe_intermediate=int(r.get("moe_intermediate_size", 512)),
             shared_expert_intermediate=int(r.get("shared_expert_intermediate_size", 512)),
             moe_layers=tuple(range(r.need("num_hidden_layers"))))
    return dict(s, intermediate=_routed_width(s))  # no dense MLP: `intermediate` is the routed width (activations)


# model_type -> (the family's settings, its default num_key_value_heads (None: the heads), its default head_dim
# (None: hidden // heads)).
FAMILIES: dict[str, tuple[Callable[[Reader], Settings], int | None, int | None]] = {
    "qwen2": (_qwen2, 32, None),
    "llama": (_llama, None, None),
    "mistral": (_mistral, 8, None),
    "glm4": (_glm4, 2, 128),
    "qwen3": (_qwen3, 32, 128),
    "qwen2_moe": (_qwen2_moe, 16, None),
    "qwen3_moe": (_qwen3_moe, 4, None),
    "qwen3_5_text": (_qwen3_5_text, 4, 256),
    "qwen3_5_moe_text": (_qwen3_5_moe_text, 2, 256),
}


# What liger-kernel 0.8.5 (the `gpu` extra) has for a family, by its monkey_patch table: (its RMSNorm/SwiGLU layer
# kernels apply, its fused linear cross-entropy forward exists, its RoPE applies). GLM-4 and Qwen3.5 raise on Liger's
# RoPE; Qwen3.5 still takes its RMSNorm (offset 1, as Qwen3.5's own) and SwiGLU, and its RoPE stays transformers'.
# Qwen2-MoE is not in Liger's table at all (transformers would warn and fuse nothing: an estimate assuming the fused
# CE would be a false fit); Qwen3.5-MoE's routed experts are not Liger's.
LIGER: dict[str, tuple[bool, bool, bool]] = {
    "glm4": (False, True, False), "qwen2_moe": (False, False, False),
    "qwen3_5_text": (True, True, False), "qwen3_5_moe_text": (False, True, False)}


def _text_settings(cfg: Settings, source: str) -> tuple[Settings, str]:
    """The decoder's settings and its model_type (a composite config's text_config; its model_type from the parent's
    when the text_config names none)."""
    text = cfg.get("text_config", cfg) if isinstance(cfg, dict) else None
    if not isinstance(text, dict):
        raise ShapeError(f"{source}: not a JSON object of model settings")
    outer = cfg.get("model_type")
    kind = text.get("model_type") or (TEXT_TYPES.get(outer, outer) if text is not cfg else outer)
    return text, kind


def shape_from_config(cfg: Any, name: str, source: str = "config.json") -> ModelShape:
    text, kind = _text_settings(cfg, source)
    _validate(text, source)
    r = Reader(text, source)
    if kind is None:
        r.need("num_attention_heads")  # a config.json that is not a decoder's names the missing field first
        raise ShapeError(f"{source}: no 'model_type'; the shape counts only {', '.join(FAMILIES)}")
    if kind not in FAMILIES:
        raise r.refuse("model_type", kind, f"the families {', '.join(FAMILIES)}")
    family, kv_default, head_dim = FAMILIES[kind]
    tie = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    settings = {**_base(r, name, kv_default, head_dim, bool(tie)), **family(r),
                "lora_targets": MOE_LORA_TARGETS.get(kind, ()),  # what `all-linear` adapts: the loader's list too
                **dict(zip(("liger_layers", "liger_fused_ce", "liger_rope"), LIGER.get(kind, (True, True, True)),
                           strict=True))}
    if settings["kv_heads"] < 1 or settings["heads"] % settings["kv_heads"]:
        raise ShapeError(f"{source}: num_key_value_heads is {settings['kv_heads']}; it must divide "
                         f"num_attention_heads ({settings['heads']})")
    return ModelShape(**settings)
