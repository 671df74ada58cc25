"""The planner's per-token terms of a Gated-DeltaNet layer (memory/activations.py) against a fake-tensor trace of the
layer (bench/fake_trace.py: transformers' PyTorch fallback on fake CPU tensors, LoRA and full, no memory, no
compute).

The trace isolates one layer kind by difference (a model of 4 layers of that kind minus one of 2, no checkpointing,
the LM head left out), and the linear-attention layer's own term as (linear layer - full-attention layer), so what
both kinds share (the MLP, norms, LoRA on the MLP) cancels. Target: the planner's term at least the traced one and
within 25 %: the term is derived from the fallback's code read in fp32, and the trace runs as the stage does, under
bf16 autocast (the Trainer's bf16=True), where the rule's matmuls keep bf16 copies: 15-18 % less on this shape. On
the GPU the allocator's peak of the whole 0.75B step is the trace's (bench/results/cuda_trace_qwen3.5-0.8b_*)."""

from __future__ import annotations

import pytest

pytest.importorskip("peft")

HYBRID = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              head_dim=32, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32,
              linear_value_head_dim=32, linear_conv_kernel_dim=4, tie_word_embeddings=True,
              max_position_embeddings=4096)
TOKENS = 256  # four 64-token chunks of the delta rule


def _config(types: list[str]):
    from transformers import AutoConfig

    return AutoConfig.for_model("qwen3_5_text", pad_token_id=0, eos_token_id=2, num_hidden_layers=len(types),
                                layer_types=types, **HYBRID)


def _traced_per_token(kind: str, method: str) -> float:
    """Bytes per token one layer of `kind` keeps at its peak, from two traces."""
    from bench.fake_trace import trace

    def above_weights(n: int) -> float:
        r = trace(_config([kind] * n), method, "bf16", 0.0, [[[TOKENS]]], head="none")
        return (r["peak_gib"] - r["breakdown_gib"].get("Parameter", 0.0)) * 2**30

    return (above_weights(4) - above_weights(2)) / 2 / TOKENS


def _planned(tmp_path, method: str) -> tuple[float, float]:
    from medgpt_ray.memory.activations import layer_activation_bytes
    from medgpt_ray.memory.estimator import TrainSetup
    from medgpt_ray.memory.shapes import load_shape

    _config(["linear_attention"] * 3 + ["full_attention"]).save_pretrained(tmp_path)
    shape = load_shape(str(tmp_path))
    setup = TrainSetup(stage="sft", method=method, precision="bf16", micro_batch=1, seq_len=TOKENS, ckpt_fraction=0.0,
                       fused_ce=True, zero=0, offload="none", gpus=1, optim="adamw")
    return layer_activation_bytes(shape, setup, True, False), layer_activation_bytes(shape, setup, False, False)


@pytest.mark.parametrize("method", ["lora", "full"])
def test_the_linear_attention_term_covers_the_traced_fallback(tmp_path, method, monkeypatch):
    from medgpt_ray.memory import activations

    traced = _traced_per_token("linear_attention", method) - _traced_per_token("full_attention", method)
    linear, full = _planned(tmp_path, method)
    assert traced <= linear - full <= 1.25 * traced, (linear - full, traced)
    # The comparison can fail: without the layer's own term the planner falls far below the trace.
    monkeypatch.setattr(activations, "_linear_attention_bytes", lambda shape, e: 0.0)
    linear, full = _planned(tmp_path, method)
    assert linear - full < 0.5 * traced
