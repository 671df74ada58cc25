"""Which attention path keeps a packed row's conversations apart (trainer_kit/packed_rows.py), checked on the loaded
model for EVERY layer type it has (docs/ARCHITECTURE.md, issue 34's hybrid models):

- layers that read the attention mask (full, sliding attention): SDPA, eager and flex attention get rows with
  position ids restarting at every conversation, and the mask the first such layer receives (flex: its BlockMask's
  mask function, token by token) must be exactly block-diagonal; FlashAttention
  gets TRL's padding-free flattened batches (its varlen kernel reads their cu_seq_lens);
- linear-attention layers (Qwen3.5's Gated DeltaNet) take no attention mask: their recurrent state and short
  convolution run on through a whole row unless the kernels are given the boundaries (trainer_kit/linear_attention.py).
  A model with any is packed only where its first linear-attention layer is hybrid/layers.py's subclass and gets the
  boundaries (the position ids in our rows, cu_seq_lens in TRL's flattened batches); else packing is refused with
  the reason."""

from __future__ import annotations

from typing import Any

import torch

from medgpt_ray.config import ConfigError
from medgpt_ray.config.base import BY_LENGTH
from medgpt_ray.trainer_kit import linear_attention as linear
from medgpt_ray.trainer_kit.checkpointing import decoder_layers

ROWS, FLAT = "rows", "flat"  # [rows, seq_len] with per-row masks (SDPA/eager); one flattened sequence (flash)
MASKED = ("full_attention", "sliding_attention")  # layer types that read the attention mask
FLEX = "flex_attention"  # transformers' name for PyTorch's flex attention (the sft stage's `attention: flex`)


def use_attention(model: Any, attention: str | None) -> None:
    """Switch a loaded model to the attention the plan trains with (StagePlan.attention; None or sdpa: as loaded).
    Switched before the packing check, which then reads the mask this attention builds."""
    if attention == "flex":
        try:
            model.set_attn_implementation(FLEX)
        except (ValueError, ImportError) as e:  # a model class without flex support (transformers' Qwen3.5)
            raise ConfigError(f"stages.sft.attention: flex, but {type(model).__name__} cannot run it ({e}); set "
                              f"sdpa or auto") from None


class _Stop(Exception):
    """Raised by the probe's hook: the layer's inputs are seen, nothing else needs to run."""


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
    """A 4-D attention mask as [rows, L, L] bool "may attend" (SDPA's bool mask, eager's additive 0/-inf, or flex
    attention's BlockMask evaluated token by token); None when the model built none (plain causal attention: every
    earlier token, across conversations)."""
    from torch.nn.attention.flex_attention import BlockMask, create_mask

    if isinstance(mask, BlockMask):  # its mask_mod, not its block layout: a partly masked block is kept whole
        rows, _, q_len, kv_len = mask.shape
        return create_mask(mask.mask_mod, rows, 1, q_len, kv_len, device=mask.kv_num_blocks.device)[:, 0]
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        return None
    first_head = mask[:, 0]
    return first_head if first_head.dtype == torch.bool else first_head == 0


def layer_types(model: Any) -> list[str]:
    """Each decoder layer's type, in order: the (text) config's `layer_types` where it has them (a hybrid's full and
    linear attention), full attention for a model without."""
    n = len(_layers(model))
    types = getattr(model.config.get_text_config(), "layer_types", None)
    return list(types)[:n] if types else ["full_attention"] * n


def _layers(model: Any) -> list[Any]:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    return list(layers) if layers is not None else decoder_layers(model)


def layer_inputs(model: Any, batch: dict[str, Any], module: Any) -> dict[str, Any]:
    """The keyword arguments `module` (a decoder layer or its token mixer) is called with when the model runs
    `batch` without a KV cache, as training does; the forward stops there (cheap on any model size)."""
    seen: dict[str, Any] = {}

    def capture(mod, args, kwargs):
        seen.update(kwargs)
        raise _Stop

    hook = module.register_forward_pre_hook(capture, with_kwargs=True)
    batch = {k: v.to(model.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    try:
        with torch.no_grad():
            model(**batch, use_cache=False)
    except _Stop:
        pass
    finally:
        hook.remove()
    return seen


def mask_the_model_builds(model: Any, position_ids: torch.Tensor) -> Any:
    """The attention mask the model's first mask-reading layer is given for these position ids and no
    attention_mask (None for a model without one)."""
    types = layer_types(model)
    first = next((i for i, t in enumerate(types) if t in MASKED), None)
    if first is None:
        return None
    batch = {"input_ids": torch.zeros_like(position_ids), "position_ids": position_ids}
    return layer_inputs(model, batch, _layers(model)[first]).get("attention_mask")


# Two rows of 6 tokens as collate_rows makes them: conversations of 3 and 2 tokens and a 1-token tail; 2 and 4.
PROBE_POSITIONS = [[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3]]
PROBE_LENGTHS = [[3, 2, 1], [2, 4]]


def probe_batch(layout: str) -> dict[str, Any]:
    """The probe's two rows as the layout's collate hands them to the model: ROWS as collate_rows makes them, FLAT
    as TRL's padding-free collator flattens them (with the cu_seq_lens_q/k, max_length_q/k and seq_idx it adds)."""
    if layout == ROWS:
        positions = torch.tensor(PROBE_POSITIONS)
        return {"input_ids": torch.zeros_like(positions), "position_ids": positions}
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    rows = [{"input_ids": [0] * sum(x), "seq_lengths": x} for x in PROBE_LENGTHS]
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(rows)
    batch.pop("labels")
    return batch


def _masked_layers_ok(model: Any, impl: str) -> str | None:
    """None when the first mask-reading layer gets a block-diagonal mask for packed rows, else why not."""
    import transformers

    positions = torch.tensor(PROBE_POSITIONS)
    try:
        got = allowed_pairs(mask_the_model_builds(model, positions))
    except Exception as e:  # a model this probe cannot run: treated as not keeping conversations apart
        return f"the {impl} mask could not be read from this model ({type(e).__name__}: {e})"
    if got is None or not torch.equal(got.cpu(), block_diagonal(positions)):
        return (f"under {impl}, transformers {transformers.__version__} does not give this model a "
                f"block-diagonal mask for packed position ids: conversations in a row would see each other")
    return None


def layers_refusal(model: Any, layout: str, impl: str) -> str | None:
    """None when every layer type of the model keeps the layout's conversations apart, else why not: the
    mask-reading layers as above (trusted under flash attention, whose varlen kernel reads cu_seq_lens), the
    linear-attention ones only where they get their boundaries (trainer_kit/linear_attention.py)."""
    types = layer_types(model)
    unknown = sorted(set(types) - {*MASKED, linear.LINEAR})
    if unknown:
        return f"its layer type(s) {', '.join(unknown)} are not ones packing is checked for"
    if layout == ROWS and any(t in MASKED for t in types):
        why = _masked_layers_ok(model, impl)
        if why:
            return why
    if linear.LINEAR not in types:
        return None
    mixer = linear.token_mixer(_layers(model)[types.index(linear.LINEAR)])
    try:
        seen = layer_inputs(model, probe_batch(layout), mixer)
    except Exception as e:  # as above: a probe that cannot run packs nothing
        return f"the inputs of its first linear-attention layer could not be read ({type(e).__name__}: {e})"
    return linear.refusal(mixer, seen, types, layout == FLAT, impl)


def attention_path(model: Any) -> tuple[str | None, str]:
    """(ROWS, FLAT or None, why) for this loaded model with this transformers."""
    impl = str(getattr(model.config, "_attn_implementation", None))
    if "flash" in impl:
        mode, why = FLAT, f"{impl}: TRL's padding-free batches (one flattened sequence per micro-batch, varlen kernel)"
    elif impl in ("sdpa", "eager"):
        mode, why = ROWS, f"{impl}: a block-diagonal causal mask per row from the position ids (checked on this model)"
    elif impl == FLEX:
        mode, why = ROWS, (f"{impl}: a block-diagonal causal BlockMask per row from the position ids (checked on this "
                           f"model); the blocks outside every conversation are skipped")
    else:
        return None, f"attention '{impl}' is not one packing is checked for (sdpa, eager, flex, flash attention)"
    refused = layers_refusal(model, mode, impl)
    if refused:
        return None, refused
    if linear.LINEAR in layer_types(model):
        why += f"; {linear.accepted()}"
    return mode, why


def resolve(setting: str | bool, model: Any, stage: str) -> tuple[str | None, str]:
    """The packing mode for the stage's `packing` setting and this model; true where unsupported is an error."""
    if setting is False:
        return None, "packing: false"
    if setting == BY_LENGTH:
        return None, "packing: by_length (never packed)"
    mode, why = attention_path(model)
    if mode is None and setting is True:
        raise ConfigError(f"stages.{stage}.packing: true, but {why}; set it to auto (packs where the attention "
                          f"keeps conversations apart) or false")
    return mode, why
