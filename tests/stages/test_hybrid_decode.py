"""A hybrid (Qwen3.5) on the static decode path (issue 47 item 4): our decoder's one static cache, reset between calls,
holds the linear-attention layers' state in place (hybrid/cached.py); greedy answers equal generate()'s token for
token in fp32 on the CPU, compiled into one graph too; and the cache is priced as what transformers allocates: K and
V on the full-attention layers only, a state per row on the linear ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from medgpt_ray import models
from medgpt_ray.generation.decode_path import StaticDecoder, static_cache_bytes
from tests.stages.hybrid_models import save_tiny_hybrid


@pytest.fixture(scope="module")
def hybrid(tiny_model, tmp_path_factory) -> Path:
    # Weights wide enough that greedy answers follow the prompt: the left padding's leak into the linear layers'
    # state (a prefill mask over the cache's columns) changed the padded row's answer at this spread, not at init's.
    return save_tiny_hybrid(tiny_model, tmp_path_factory.mktemp("hybrid-decode"), spread=0.2)


def _prompts(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of 30 tokens, the second left-padded by 7."""
    ids = torch.randint(5, vocab, (2, 30), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    return ids, mask


def _tensor_bytes(obj) -> int:
    """The bytes of the tensors `obj` holds; scalars (a layer's int64 position counter) are bookkeeping."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size() if obj.dim() else 0
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


@pytest.mark.parametrize("compiled", [False, True])
def test_the_static_path_answers_as_generate_and_prices_its_cache(hybrid, compiled):
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    model = models.load_causal_lm(hybrid, "fp32", "full").eval()
    ids, mask = _prompts(model.config.vocab_size)
    kw = {"max_new_tokens": 10, "do_sample": False, "pad_token_id": model.config.pad_token_id}
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, **kw)
    config = None
    if compiled:
        config = CompileConfig(backend="eager", mode=None, dynamic=False)
        config._compile_all_devices = True  # transformers compiles the decode step on the CPU too
        torch._dynamo.reset()
        counters.clear()
    decoder = StaticDecoder(64, config)
    for _ in range(2):  # the second call resets the cache in place and reuses it
        with torch.no_grad():
            got = decoder.generate(model, ids, attention_mask=mask, **kw)
        assert torch.equal(got, want)
    stats = decoder.stats()
    assert stats["cache_builds"] == 1 and stats["loop"] == "medgpt"
    if compiled:
        assert stats["graphs_compiled"] == 1 and not counters["graph_break"]
    allocated = sum(_tensor_bytes(vars(layer)) for layer in decoder.cache.layers)
    assert allocated == static_cache_bytes(model.config, 2, 64, dtype_bytes=4)


def test_left_padding_stays_out_of_the_linear_layers_state(hybrid):
    """Our loop's prefill hands the prompt's own mask, as generate does: a linear-attention layer zeroes the padding
    by the 2D mask's trailing columns, and a mask over the whole static cache put the padded rows' pad tokens into
    their recurrent state (here a padded row answered otherwise from its first token)."""
    model = models.load_causal_lm(hybrid, "fp32", "full").eval()
    ids = torch.randint(5, model.config.vocab_size, (4, 24), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)
    mask[1::2, :6] = 0
    kw = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": model.config.pad_token_id}
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, **kw)
        got = StaticDecoder(40).generate(model, ids, attention_mask=mask, **kw)
    assert torch.equal(got, want)
