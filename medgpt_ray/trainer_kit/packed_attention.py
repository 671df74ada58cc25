"""Which attention path keeps a packed row's conversations apart (trainer_kit/packed_rows.py): SDPA and eager get
rows with position ids restarting at every conversation, checked on the loaded model (the mask its first decoder
layer receives must be exactly block-diagonal); FlashAttention gets TRL's padding-free flattened batches."""

from __future__ import annotations

from typing import Any

import torch

from medgpt_ray.config import ConfigError
from medgpt_ray.trainer_kit.checkpointing import decoder_layers

ROWS, FLAT = "rows", "flat"  # [rows, seq_len] with per-row masks (SDPA/eager); one flattened sequence (flash)


class _Stop(Exception):
    """Raised by the probe's hook: the forward has built its mask, nothing else needs to run."""


def _segments(position_ids: torch.Tensor) -> torch.Tensor:
    """Which conversation (or tail padding) each token belongs to: a new one wherever the position restarts at 0."""
    return (position_ids == 0).cumsum(-1)


def block_diagonal(position_ids: torch.Tensor) -> torch.Tensor:
    """[rows, L, L] bool: token i may attend to token j when both are in the same conversation and j <= i."""
    seg = _segments(position_ids)
    n = position_ids.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=position_ids.device).tril()
    return (seg[:, :, None] == seg[:, None, :]) & causal


def allowed_pairs(mask: Any) -> torch.Tensor | None:
    """A 4-D attention mask as [rows, L, L] bool "may attend" (SDPA's bool mask, or eager's additive 0/-inf);
    None when the model built none (plain causal attention: every earlier token, across conversations)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        return None
    first_head = mask[:, 0]
    return first_head if first_head.dtype == torch.bool else first_head == 0


def mask_the_model_builds(model: Any, position_ids: torch.Tensor) -> Any:
    """The attention mask the model's first decoder layer is given for these position ids and no attention_mask
    (the forward stops there: embeddings and mask only, cheap on any model size)."""
    layers = decoder_layers(model)
    if not layers:
        return None
    seen: dict[str, Any] = {}

    def capture(module, args, kwargs):
        seen["mask"] = kwargs.get("attention_mask")
        raise _Stop

    hook = layers[0].register_forward_pre_hook(capture, with_kwargs=True)
    position_ids = position_ids.to(model.device)
    try:
        with torch.no_grad():
            model(input_ids=torch.zeros_like(position_ids), position_ids=position_ids, use_cache=False)
    except _Stop:
        pass
    finally:
        hook.remove()
    return seen.get("mask")


# Two rows of 6 tokens as collate_rows makes them: conversations of 3 and 2 tokens and a 1-token tail; 2 and 4.
PROBE_POSITIONS = [[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3]]


def attention_path(model: Any) -> tuple[str | None, str]:
    """(ROWS, FLAT or None, why) for this loaded model with this transformers."""
    import transformers

    impl = str(getattr(model.config, "_attn_implementation", None))
    if "flash" in impl:
        return FLAT, f"{impl}: TRL's padding-free batches (one flattened sequence per micro-batch, varlen kernel)"
    if impl not in ("sdpa", "eager"):
        return None, f"attention '{impl}' is not one packing is checked for (sdpa, eager, flash attention)"
    positions = torch.tensor(PROBE_POSITIONS)
    try:
        got = allowed_pairs(mask_the_model_builds(model, positions))
    except Exception as e:  # a model this probe cannot run: treated as not keeping conversations apart
        return None, f"the {impl} mask could not be read from this model ({type(e).__name__}: {e})"
    if got is None or not torch.equal(got.cpu(), block_diagonal(positions)):
        return None, (f"under {impl}, transformers {transformers.__version__} does not give this model a "
                      f"block-diagonal mask for packed position ids: conversations in a row would see each other")
    return ROWS, f"{impl}: a block-diagonal causal mask per row from the position ids (checked on this model)"


def resolve(setting: str | bool, model: Any, stage: str) -> tuple[str | None, str]:
    """The packing mode for the stage's `packing` setting and this model; true where unsupported is an error."""
    if setting is False:
        return None, "packing: false"
    mode, why = attention_path(model)
    if mode is None and setting is True:
        raise ConfigError(f"stages.{stage}.packing: true, but {why}; set it to auto (packs where the attention "
                          f"keeps conversations apart) or false")
    return mode, why
