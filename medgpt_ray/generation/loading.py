"""A trained model loaded for generation: on the GPU in bf16 where the process sees one, else on the CPU in fp32;
its tokenizer pads on the left, so that new tokens continue every prompt of a batch at the same position."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def generation_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_tokenizer(model_path: str) -> Any:
    from transformers.utils import logging as hf_logging

    from medgpt_ray import models

    hf_logging.disable_progress_bar()  # our progress lines say what happens
    tok = models.load_tokenizer(Path(model_path))
    tok.padding_side = "left"  # new tokens continue every prompt at the same position
    return tok


def load_model(model_path: str, device: str) -> Any:
    from medgpt_ray import models

    precision = "bf16" if device == "cuda" else "fp32"
    return models.load_causal_lm(Path(model_path), precision, "full").to(device).eval()
