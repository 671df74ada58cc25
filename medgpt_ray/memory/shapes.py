"""A model's shape: what the memory and throughput models need, read from config.json or a preset.

Only the architecture counts here, never the weights: `medgpt-ray estimate --model DIR`
reads DIR/config.json and nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path

from medgpt_ray.memory.families import FAMILIES, shape_from_config
from medgpt_ray.memory.shape_model import NF4_BYTES_PER_PARAM, ModelShape, ShapeError

__all__ = ["FAMILIES", "NF4_BYTES_PER_PARAM", "PRESETS", "PUBLISHED_CONFIGS", "ModelShape", "ShapeError",
           "load_shape", "shape_from_config"]

# Shapes from the published config.json files of these checkpoints.
PRESETS: dict[str, ModelShape] = {
    "qwen2.5-0.5b": ModelShape("qwen2.5-0.5b", 151936, 896, 24, 14, 2, 4864, True),
    "qwen2.5-1.5b": ModelShape("qwen2.5-1.5b", 151936, 1536, 28, 12, 2, 8960, True),
    "qwen2.5-7b": ModelShape("qwen2.5-7b", 152064, 3584, 28, 28, 4, 18944, False),
    "llama2-7b": ModelShape("llama2-7b", 32000, 4096, 32, 32, 32, 11008, False, qkv_bias=False),
}
# The architecture fields of the published config.json files (Qwen/Qwen3-8B, Qwen/Qwen3-30B-A3B), counted as a
# config.json is (memory/families.py): what `model.shape` plans from on a machine without the checkpoint.
PUBLISHED_CONFIGS: dict[str, dict[str, object]] = {
    "qwen3-8b": {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
                 "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                 "attention_bias": False, "tie_word_embeddings": False},
    "qwen3-30b-a3b": {"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
                      "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                      "attention_bias": False, "tie_word_embeddings": False, "num_experts": 128,
                      "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
                      "mlp_only_layers": []},
}
PRESETS.update({name: shape_from_config(cfg, name, f"preset {name}") for name, cfg in PUBLISHED_CONFIGS.items()})


def _tiny_shape() -> ModelShape:
    from medgpt_ray.tiny import TINY_SHAPE, VOCAB_SIZE

    t = TINY_SHAPE
    return ModelShape("tiny", VOCAB_SIZE, t["hidden_size"], t["num_hidden_layers"], t["num_attention_heads"],
                      t["num_key_value_heads"], t["intermediate_size"], True)


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
