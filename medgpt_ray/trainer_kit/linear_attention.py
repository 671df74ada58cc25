"""Whether a model's linear-attention layers (Qwen3.5's Gated DeltaNet) keep packed conversations apart
(trainer_kit/packed_attention.py asks; docs/ARCHITECTURE.md, issue 34).

Such a layer takes no attention mask. What it does with a packed row, in transformers 5.24 (pinned) and 5.17 (the GPU
image), read from their Qwen3.5 code and seen in tests/stages/test_hybrid_packing.py:
- rows with position ids restarting at each conversation (our SDPA/eager path): the layer receives no boundary at
  all (its mask is for padding only, and None without an attention_mask); the recurrent state and the short
  convolution run on from one conversation into the next. Silently, with or without the kernels below.
- TRL's padding-free batches (our FlashAttention path): `cu_seq_lens_q` and `seq_idx` reach the layer, which hands
  them to flash-linear-attention's `chunk_gated_delta_rule` (cu_seqlens) and causal-conv1d's `causal_conv1d_fn`
  (seq_idx). Without those packages transformers falls back to PyTorch: 5.24's fallback raises ("can't keep packed
  sequences apart without ..."), 5.17's drops the boundaries silently. (The rows path cannot simply add them:
  flash-linear-attention takes cu_seqlens only for a batch of one flattened sequence.)
So a linear-attention layer packs only when the boundaries reach it AND both kernel packages are importable (they
run on CUDA only). Nothing here runs them: with the kernels installed, the equality of packed and unpacked losses
is the test's to show (tests/stages/test_hybrid_packing.py, skipped where they cannot run)."""

from __future__ import annotations

import importlib
from typing import Any

LINEAR = "linear_attention"
BOUNDARIES = ("cu_seq_lens_q", "seq_idx")  # what TRL's padding-free batches give the linear-attention kernels
# (module, function, distribution, how to install it): the kernels transformers routes the boundaries to.
KERNELS = (
    ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule", "flash-linear-attention", "pip install 'medgpt-ray[gpu]'"),
    ("causal_conv1d", "causal_conv1d_fn", "causal-conv1d", "a CUDA build: pip install causal-conv1d where nvcc is"),
)
ACCEPTED = ("linear-attention layers get the sequence boundaries (cu_seq_lens_q, seq_idx) and the boundary-aware "
            "kernels (flash-linear-attention, causal-conv1d)")


def token_mixer(layer: Any) -> Any:
    """The module of a linear-attention decoder layer that takes the boundaries (Qwen3.5: `linear_attn`)."""
    return getattr(layer, "linear_attn", layer)


def missing_kernels() -> list[tuple[str, str]]:
    """(distribution, how to install it) of each boundary-aware kernel package this process cannot import."""
    missing = []
    for module, func, dist, how in KERNELS:
        try:
            getattr(importlib.import_module(module), func)
        except Exception:  # not installed, or installed without its compiled part: either way not usable
            missing.append((dist, how))
    return missing


def kernels_sentence(missing: list[tuple[str, str]]) -> str:
    """The one sentence that names the missing kernel packages."""
    return ("the boundary-aware linear-attention kernels are missing here: "
            + " and ".join(f"{dist} ({how})" for dist, how in missing))


def refusal(seen: dict[str, Any], types: list[str], flat: bool, impl: str) -> str | None:
    """None when the first linear-attention layer received the boundaries (`seen`: its keyword arguments in the
    probe's forward) and the kernels are importable; else why packing would leak between conversations."""
    import transformers

    n = f"{types.count(LINEAR)} of its {len(types)} layers are linear attention"
    missing = missing_kernels()
    got = [k for k in BOUNDARIES if seen.get(k) is not None]
    if len(got) < len(BOUNDARIES):
        layout = "TRL's padding-free batches" if flat else f"{impl} rows with per-conversation position ids"
        return (f"{n}: they take no attention mask and get no sequence boundaries ({', '.join(BOUNDARIES)}) from "
                f"transformers {transformers.__version__} in {layout}, so packed conversations would share their "
                f"recurrent state (the boundaries come only in TRL's padding-free batches, under flash attention, "
                f"and need the boundary-aware kernels)" + (f"; {kernels_sentence(missing)}" if missing else ""))
    if missing:
        return f"{n}, and {kernels_sentence(missing)}: without them packed conversations would share state"
    return None
