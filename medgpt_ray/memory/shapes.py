"""A model's shape: what the memory and throughput models need, read from config.json or a preset.

Only the architecture counts here, never the weights: `medgpt-ray estimate --model DIR`
reads DIR/config.json and nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path

from medgpt_ray.memory.families import FAMILIES, shape_from_config
from medgpt_ray.memory.shape_model import NF4_BYTES_PER_PARAM, ModelShape, ShapeError

__all__ = ["FAMILIES", "NF4_BYTES_PER_PARAM", "PRESETS", "ModelShape", "ShapeError", "load_shape",
           "shape_from_config"]

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
