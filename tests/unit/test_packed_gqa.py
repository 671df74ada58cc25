"""The static decode step's attention without repeat_kv (generation/packed_gqa.py): for a one-token query it gives
transformers' SDPA attention's output (which repeats K and V to every head), the padding mask respected; the model
is switched to it only inside the block, and back after an error too."""

from __future__ import annotations

import pytest
import torch

from medgpt_ray.generation.packed_gqa import PACKED_GQA, packed_gqa_attention, packed_gqa_decoding


class Grouped(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


@pytest.mark.parametrize("q_len", [1, 5])
def test_packed_attention_equals_sdpa_with_repeated_kv(q_len):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    batch, kv_heads, length, dim = 2, 2, 11, 8
    query = torch.randn(batch, kv_heads * 3, q_len, dim)
    key, value = torch.randn(batch, kv_heads, length, dim), torch.randn(batch, kv_heads, length, dim)
    mask = torch.ones(batch, 1, q_len, length, dtype=torch.bool)
    mask[0, :, :, :4] = False  # the first sequence left-padded
    out, _ = packed_gqa_attention(Grouped(), query, key, value, mask, scaling=dim ** -0.5)
    want, _ = sdpa_attention_forward(Grouped(), query, key, value, mask, scaling=dim ** -0.5)
    assert out.shape == want.shape == (batch, q_len, kv_heads * 3, dim)
    torch.testing.assert_close(out, want)
    # Had the padding been ignored, the first sequence's answer would differ.
    unmasked, _ = packed_gqa_attention(Grouped(), query, key, value, torch.ones_like(mask), scaling=dim ** -0.5)
    assert not torch.allclose(unmasked[0], want[0])


def test_the_model_decodes_on_it_only_inside_the_block(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="sdpa")
    with packed_gqa_decoding(model) as switched:
        assert switched and model.config._attn_implementation == PACKED_GQA
        with packed_gqa_decoding(model) as inner:  # nested: the outer block keeps it
            assert inner
        assert model.config._attn_implementation == PACKED_GQA
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError), packed_gqa_decoding(model):
        raise RuntimeError("a failed generate call")
    assert model.config._attn_implementation == "sdpa"
    with packed_gqa_decoding(model, enabled=False) as switched:
        assert not switched and model.config._attn_implementation == "sdpa"
    model.set_attn_implementation("eager")  # not SDPA: left as it is
    with packed_gqa_decoding(model) as switched:
        assert not switched and model.config._attn_implementation == "eager"
