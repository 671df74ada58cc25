"""Whether a model's linear-attention layers (Qwen3.5's Gated DeltaNet) keep packed conversations apart
(trainer_kit/packed_attention.py asks; docs/ARCHITECTURE.md, issues 34 and 47).

Such a layer takes no attention mask, and transformers (5.24 pinned, 5.17 on the GPU image) hands it no position ids:
on its own it runs its recurrent state and short convolution on from one conversation into the next. Models loaded
through models.load_causal_lm have hybrid/layers.py's subclass instead, which takes the position ids from its
decoder layer (our rows) or `cu_seq_lens_q` (TRL's padding-free batches) and starts every conversation from a zero
state, on flash-linear-attention's kernels where they run, else on transformers' PyTorch reference. So packing is
accepted where the probe's first linear-attention layer is that subclass and got the boundaries, and the sentence
says which kernels it trains on (hybrid/kernels.py)."""

from __future__ import annotations

from typing import Any

from medgpt_ray.hybrid import kernels
from medgpt_ray.hybrid.layers import POSITIONS, is_installed

LINEAR = "linear_attention"
ROWS_KEY, FLAT_KEY = POSITIONS, "cu_seq_lens_q"  # what reaches the layer in our rows / TRL's flattened batches


def token_mixer(layer: Any) -> Any:
    """The module of a linear-attention decoder layer that takes the boundaries (Qwen3.5: `linear_attn`)."""
    return getattr(layer, "linear_attn", layer)


def kernels_sentence() -> str:
    """Which kernels a training step's linear-attention layers run on in this process, and why."""
    found = kernels.probe()
    path = "flash-linear-attention's kernels" if found.training == kernels.KERNELS else "the PyTorch reference"
    return f"on {path} ({found.why})"


def refusal(mixer: Any, seen: dict[str, Any], types: list[str], flat: bool, impl: str) -> str | None:
    """None when the first linear-attention layer (`mixer`) keeps conversations apart: it is hybrid/layers.py's
    subclass and the probe's forward handed it the boundaries (`seen`: its keyword arguments); else why not."""
    import transformers

    n = f"{types.count(LINEAR)} of its {len(types)} layers are linear attention"
    if not is_installed(mixer):
        return (f"{n}, loaded without medgpt-ray's linear-attention layer (models.load_causal_lm installs it): "
                f"transformers' own takes no boundaries, so packed conversations would share their recurrent state")
    key = FLAT_KEY if flat else ROWS_KEY
    if seen.get(key) is None:
        layout = "TRL's padding-free batches" if flat else f"{impl} rows with per-conversation position ids"
        return (f"{n}: with transformers {transformers.__version__} their layers got no sequence boundaries ({key}) "
                f"in {layout}, so packed conversations would share their recurrent state")
    return None


def accepted() -> str:
    return f"linear-attention layers start every conversation from a zero state, {kernels_sentence()}"
