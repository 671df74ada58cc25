"""A model's shape: what the memory and throughput models need, read from config.json or a preset.

Only the architecture counts here, never the weights: `medgpt-ray estimate --model DIR`
reads DIR/config.json and nothing else.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# bitsandbytes NF4 with double quantization: 4 bits + an 8-bit absmax per 64 weights + an fp32 absmax per 256 blocks
# (the bytes a 4-bit linear weight is held in: QLoRA's base, opd's 4-bit teacher).
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)


@dataclass(frozen=True)
class ModelShape:
    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied_embeddings: bool
    qkv_bias: bool = True  # Qwen2 has q/k/v biases; Llama has none

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def linear_params_per_layer(self) -> int:
        """The weights of one decoder layer's linear projections: what LoRA adapts and 4-bit quantizes."""
        h, kv, i = self.hidden, self.kv_dim, self.intermediate
        return h * h + 2 * h * kv + h * h + 3 * h * i

    @property
    def linear_params(self) -> int:
        return self.layers * self.linear_params_per_layer

    @property
    def small_params(self) -> int:
        """Norms and biases: tiny, kept in 16 bits (never quantized)."""
        bias = (self.hidden + 2 * self.kv_dim) if self.qkv_bias else 0
        return self.layers * (2 * self.hidden + bias) + self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def params(self) -> int:
        return self.linear_params + self.small_params + self.embedding_params + self.head_params

    def lora_params(self, rank: int) -> int:
        """PEFT `all-linear`: A (r x in) and B (out x r) on every projection of every layer."""
        h, kv, i = self.hidden, self.kv_dim, self.intermediate
        in_out = [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]
        return self.layers * sum(rank * (a + b) for a, b in in_out)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "params": self.params}


# Shapes from the published config.json files of these checkpoints.
PRESETS: dict[str, ModelShape] = {
    "qwen2.5-0.5b": ModelShape("qwen2.5-0.5b", 151936, 896, 24, 14, 2, 4864, True),
    "qwen2.5-1.5b": ModelShape("qwen2.5-1.5b", 151936, 1536, 28, 12, 2, 8960, True),
    "qwen2.5-7b": ModelShape("qwen2.5-7b", 152064, 3584, 28, 28, 4, 18944, False),
    "llama2-7b": ModelShape("llama2-7b", 32000, 4096, 32, 32, 32, 11008, False, qkv_bias=False),
}


def _tiny_shape() -> ModelShape:
    from medgpt_ray.tiny import TINY_SHAPE, VOCAB_SIZE

    t = TINY_SHAPE
    return ModelShape("tiny", VOCAB_SIZE, t["hidden_size"], t["num_hidden_layers"], t["num_attention_heads"],
                      t["num_key_value_heads"], t["intermediate_size"], True)


class ShapeError(ValueError):
    pass


SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def shape_from_config(cfg: Any, name: str, source: str = "config.json") -> ModelShape:
    if not isinstance(cfg, dict) or not isinstance(cfg.get("text_config", cfg), dict):
        raise ShapeError(f"{source}: not a JSON object of model settings")
    text = cfg.get("text_config", cfg)
    for key in (*SHAPE_KEYS, "num_key_value_heads"):
        value = text.get(key)
        if key in text and value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ShapeError(f"{source}: {key} is {value!r}; expected a positive integer")
    try:
        heads = int(text["num_attention_heads"])
        return ModelShape(
            name=name,
            vocab=int(text["vocab_size"]),
            hidden=int(text["hidden_size"]),
            layers=int(text["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(text.get("num_key_value_heads") or heads),
            intermediate=int(text["intermediate_size"]),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            qkv_bias=bool(text.get("attention_bias", text.get("model_type", cfg.get("model_type")) == "qwen2")),
        )
    except KeyError as e:
        raise ShapeError(f"{source}: no {e.args[0]!r}; not a decoder-only transformer config") from None


def load_shape(model: str) -> ModelShape:
    """A preset name (`qwen2.5-7b`, `tiny`, ...) or a local checkpoint directory (its config.json only)."""
    key = model.lower()
    if key == "tiny":
        return _tiny_shape()
    if key in PRESETS:
        return PRESETS[key]
    path = Path(model).expanduser()
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ShapeError(
            f"--model {model!r}: neither a preset ({', '.join(['tiny', *PRESETS])}) nor a directory with a "
            f"config.json"
        )
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ShapeError(f"{cfg_file}: not a JSON text file ({type(e).__name__})") from None
    return shape_from_config(cfg, path.name, str(cfg_file))
