"""Random-init model directories of today's families for GPU calibration (issue 34 item 5).

Each name maps to a `config.json` of its family's own transformers config class (no weights are downloaded: the
weights are random, built on the GPU, saved as safetensors with the tiny preset's tokenizer beside them, as
prepare_model below does for the Qwen2.5 shapes too). The planner reads the same config.json
(memory/families.py), so the prediction and the measured model are of one shape.

- qwen3-8b: Qwen3-8B's published config.json values (36 layers, head_dim 128, q/k norm).
- qwen3.5-0.8b: a Qwen3.5 text model of the 0.8B size and layout (24 layers, 3 of 4 Gated-DeltaNet linear
  attention, gated full attention with head_dim 256, 248,320-token vocabulary, tied embeddings). Its dimensions
  are ours, not copied from a released checkpoint: the calibration needs the layout and the size, not the weights.
- qwen3-moe-8l: Qwen3-30B-A3B with 8 of its 48 layers: the same hidden size, 128 experts of 768, 8 routed per
  token, attention (32 heads, 4 KV heads, head_dim 128) and vocabulary: the expert ratios of the real model at a
  size one 24 GiB card can hold with LoRA.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

QWEN3_8B = {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
            "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "max_position_embeddings": 40960, "rope_theta": 1000000, "tie_word_embeddings": False}
QWEN3_5_08B = {"model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 1024, "intermediate_size": 3584,
               "num_hidden_layers": 24, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
               "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
               "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "tie_word_embeddings": True,
               "max_position_embeddings": 32768}
QWEN3_MOE_8L = {"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
                "num_hidden_layers": 8, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                "max_position_embeddings": 32768, "tie_word_embeddings": False}
FAMILY_MODELS: dict[str, dict[str, Any]] = {"qwen3-8b": QWEN3_8B, "qwen3.5-0.8b": QWEN3_5_08B,
                                            "qwen3-moe-8l": QWEN3_MOE_8L}
TOKENIZER_FILES = ("special_tokens_map.json", "vocab.json", "merges.txt", "chat_template.jinja")


def family_config(name: str) -> Any:
    from transformers import AutoConfig

    settings = dict(FAMILY_MODELS[name])
    return AutoConfig.for_model(settings.pop("model_type"), pad_token_id=0, eos_token_id=2, bos_token_id=None,
                                **settings)


def prepare_model(name: str, dest: Path, tokenizer_dir: Path) -> Path:
    """`dest/name` with random bf16 weights (built on CUDA) and the tiny tokenizer: a family of FAMILY_MODELS, else a
    preset Qwen2-family shape of memory/shapes.py. Every bench that needs a random-weight model builds it here."""
    return prepare_family_model(name, dest, tokenizer_dir) if name in FAMILY_MODELS else \
        _random_weights(shape_config(name), dest / name, tokenizer_dir)


def prepare_family_model(name: str, dest: Path, tokenizer_dir: Path) -> Path:
    """`dest/name` with random bf16 weights of the family's shape (built on CUDA) and the tiny tokenizer."""
    return _random_weights(family_config(name), dest / name, tokenizer_dir)


def _random_weights(config: Any, out: Path, tokenizer_dir: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    if (out / "config.json").is_file():
        return out
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with model_dir_written(out) as part:
        model.save_pretrained(part, safe_serialization=True)
        for f in tokenizer_dir.iterdir():
            if f.name.startswith("tokenizer") or f.name in TOKENIZER_FILES:
                shutil.copy(f, part / f.name)
    del model
    torch.cuda.empty_cache()
    return out


@contextmanager
def model_dir_written(out: Path) -> Iterator[Path]:
    """A model directory written whole or not at all: into `out.partial`, renamed to `out` at the end. A save cut
    short (a full disk on a reused machine) otherwise leaves a config.json that the next call takes for a model."""
    part = out.with_name(out.name + ".partial")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    try:
        yield part
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    part.rename(out)


def write_config_only(name: str, dest: Path) -> Path:
    """The config.json alone (what `medgpt-ray plan` needs): for re-predicting a committed result here."""
    out = dest / name
    family_config(name).save_pretrained(out)
    return out


def shape_config(shape_name: str) -> Any:
    """The transformers config of a preset Qwen2-family shape (memory/shapes.py), what prepare_model builds."""
    from transformers import Qwen2Config

    from medgpt_ray.memory.shapes import load_shape

    s = load_shape(shape_name)
    return Qwen2Config(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                       num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, intermediate_size=s.intermediate,
                       tie_word_embeddings=s.tied_embeddings, max_position_embeddings=32768, rope_theta=1e6,
                       pad_token_id=0, eos_token_id=2, bos_token_id=None)
