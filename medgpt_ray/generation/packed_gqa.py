"""Grouped-query attention in a decode step without `repeat_kv`: the static path's attention while it decodes.

transformers' SDPA attention takes grouped-query attention natively (`enable_gqa`) only without a mask, and
generation always passes one (padding; the static cache's full length). So every decode step copies K and V of
every layer to every query head over the cache's whole length (`repeat_kv`). For Qwen2.5-1.5B at 16 sequences and a
512-token cache those copies move about as many bytes as the weights do (2 x 28 layers x 50 MB a step, against
3.1 GB of weights); the H200's static steps were priced with them (memory/throughput.py). transformers 5.24 avoids
the copy for one query token by folding the query heads of each KV head into the query's length (`pack_gqa`), but
not while dynamo compiles, which is exactly the static path's decode step; 5.17 (the GPU image's) never does.

PACKED_GQA is that fold as an attention function of its own, registered through transformers' AttentionInterface
(with SDPA's mask function): a one-token query of shape (batch, heads, 1, dim) becomes (batch, kv_heads, heads per
KV head, dim) against K and V as cached, the mask (batch, 1, 1, length) broadcast over both; the output is the same
attention, reshaped back. Anything else (a prefill, a per-head mask, a model without grouped heads) is transformers'
own SDPA attention unchanged. `packed_gqa_decoding` switches a model from "sdpa" to it for the generate call only,
so training forwards never see it. The switch is the model's config: it assumes no other thread runs the same model
meanwhile, which holds for every StaticDecoder caller (a trainer's rollouts, the Generator's batches, chat's one
session thread; serve's concurrent fallback decodes dynamically, without a StaticDecoder)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from medgpt_ray.generation.decode_loop import text_model

PACKED_GQA = "medgpt_packed_gqa_sdpa"


def packed_gqa_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                         scaling: float | None = None, is_causal: bool | None = None,
                         **kwargs: Any) -> tuple[Any, None]:
    """transformers' attention-function signature: (output as (batch, length, heads, dim), no weights)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    per_head_mask = attention_mask is not None and attention_mask.shape[1] != 1
    if query.shape[2] != 1 or groups == 1 or per_head_mask or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    batch, heads, _, dim = query.shape
    folded = query.reshape(batch, heads // groups, groups, dim)  # heads are grouped by KV head, as repeat_kv orders
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling)
    return out.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def register() -> None:
    """PACKED_GQA in transformers' attention and mask registries (idempotent)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(PACKED_GQA, packed_gqa_attention)
    AttentionMaskInterface.register(PACKED_GQA, sdpa_mask)


def applies(model: Any) -> bool:
    """Whether the decode step of `model` (its text config) would repeat K and V: SDPA attention with fewer KV heads
    than query heads."""
    text = model.config.get_text_config(decoder=True)
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    return text._attn_implementation in ("sdpa", PACKED_GQA) and kv_heads < text.num_attention_heads


@contextmanager
def packed_gqa_decoding(model: Any, enabled: bool = True) -> Iterator[bool]:
    """`model` (a PeftModel's base) on PACKED_GQA for the block where it would repeat K and V, back on SDPA after;
    yields whether it switched."""
    base = text_model(model)
    if not enabled or not applies(base):
        yield False
        return
    if base.config.get_text_config(decoder=True)._attn_implementation == PACKED_GQA:  # an outer block switched it
        yield True
        return
    register()
    base.set_attn_implementation(PACKED_GQA)
    try:
        yield True
    finally:
        base.set_attn_implementation("sdpa")
