"""Tiny random Qwen3.5 text models for the hybrid tests: 4 layers (3 Gated DeltaNet, 1 full attention by default),
grouped value heads on the linear layers (2 key heads, 4 value heads), the tiny tokenizer beside the weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
              linear_conv_kernel_dim=3)


def save_tiny_hybrid(tokenizer_dir: Path, out: Path, layer_types: list[str] | None = None,
                     spread: float | None = None) -> Path:
    """The model saved at `out` with the tokenizer (and chat template) of `tokenizer_dir`; `spread`: 2-D weights drawn
    with this standard deviation, so greedy answers depend on the prompt."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from medgpt_ray import models

    tok = models.load_tokenizer(tokenizer_dir)
    kw: dict[str, Any] = {"layer_types": layer_types} if layer_types else {}
    cfg = Qwen3_5TextConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **LINEAR, **kw)
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(cfg)
    if spread:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, spread)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
