"""Issue 34 item 2/3: per-token memory of a MoE follows its active experts (experts_per_token), not all of them;
a hybrid's (Qwen3.5) linear-attention layers have their own activation terms, and during generation hold a fixed
state instead of a KV cache. Every expected number is derived from the shape, none is a hard-coded total."""

from __future__ import annotations

from dataclasses import replace

import pytest
import transformers as tf

from medgpt_ray.memory.activations import activation_terms, layer_activation_bytes, layer_kinds
from medgpt_ray.memory.generation import estimate_grpo, kv_cache_bytes, linear_state_bytes
from medgpt_ray.memory.setup import TrainSetup
from medgpt_ray.memory.shapes import load_shape

# The shapes: Qwen3-30B-A3B (every layer routed, 8 of 128 experts) and a ~2B Qwen3.5 text model (3 of 4
# layers linear attention).
MOE = tf.Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                        num_experts_per_tok=8, moe_intermediate_size=768)
HYBRID = tf.Qwen3_5TextConfig(vocab_size=248320, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                              num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                              linear_num_value_heads=16, tie_word_embeddings=True)
LORA = TrainSetup(stage="sft", method="lora", precision="bf16", micro_batch=2, seq_len=1024, ckpt_fraction=0.0)


def shape_of(cfg, tmp_path):
    cfg.save_pretrained(tmp_path)
    return load_shape(str(tmp_path))


@pytest.mark.parametrize("method", ["lora", "full"])
def test_a_routed_layer_saves_the_active_experts_not_all_of_them(method, tmp_path):
    shape, s = shape_of(MOE, tmp_path), replace(LORA, method=method)
    assert set(layer_kinds(shape)) == {(False, True)}  # every layer routes
    moe = layer_activation_bytes(shape, s, moe=True)
    e, h, mi = 2, shape.hidden, shape.moe_intermediate
    # One more active expert: its SwiGLU (3 x moe_intermediate), its output, and under full training its two
    # inputs (weight grads); its routing weight, index and token positions (20 bytes).
    per_expert = e * (3 * mi + h) + 20 + (e * (h + mi) if method == "full" else 0)
    assert layer_activation_bytes(replace(shape, experts_per_token=9), s, moe=True) - moe == per_expert
    # Twice the experts, the same 8 active: only the router's [tokens x experts] logits and softmax grow.
    assert layer_activation_bytes(replace(shape, experts=256), s, moe=True) - moe == (e + 4) * 128
    # The dense `intermediate` (6144, unused when every layer routes) is not what a routed layer keeps.
    assert layer_activation_bytes(replace(shape, intermediate=1), s, moe=True) == moe


def test_a_moe_models_activations_add_up_its_layers_by_kind(tmp_path):
    """A Qwen2-MoE with a dense MLP layer: the saved activations are each layer's own, routed or dense."""
    cfg = tf.Qwen2MoeConfig(vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, num_experts=6, num_experts_per_tok=2,
                            moe_intermediate_size=40, shared_expert_intermediate_size=56, mlp_only_layers=[1])
    shape = shape_of(cfg, tmp_path)
    dense, routed = layer_activation_bytes(shape, LORA), layer_activation_bytes(shape, LORA, moe=True)
    assert dense != routed
    edges = (2 * 2 + 4) * shape.hidden
    assert activation_terms(shape, LORA)["activations"] == pytest.approx(
        LORA.tokens() * (dense + 3 * routed + edges))
    # The widest MLP a token runs through: here the dense layer's (96) against 2 x 40 + 56 routed.
    assert shape.mlp_width == max(shape.intermediate, 2 * 40 + 56)


def test_lora_on_a_moe_keeps_only_the_inputs_of_what_it_adapts(tmp_path):
    """Qwen3-MoE's LoRA adapts attention only (config/lora_targets.py): a narrower expert shrinks only the active
    experts' SwiGLU, and one more rank widens the four attention adapters' lora_B inputs only."""
    shape = shape_of(MOE, tmp_path)
    moe = layer_activation_bytes(shape, LORA, moe=True)
    k, mi = shape.experts_per_token, shape.moe_intermediate
    assert moe - layer_activation_bytes(replace(shape, moe_intermediate=mi - 1), LORA, moe=True) == 2 * 3 * k
    wider = layer_activation_bytes(shape, replace(LORA, lora_rank=LORA.lora_rank + 1), moe=True)
    assert wider - moe == 2 * len(shape.lora_adapted(shape.attention_linears())) == 2 * 4
    # With a shared expert that LoRA adapts (Qwen2-MoE-like targets), its three projections widen too.
    shared = replace(shape, shared_expert_intermediate=512, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj",
                                                                          "gate_proj", "up_proj", "down_proj"))
    base = layer_activation_bytes(shared, LORA, moe=True)
    assert layer_activation_bytes(shared, replace(LORA, lora_rank=9), moe=True) - base == 2 * (4 + 3)


def test_a_hybrids_kv_cache_counts_only_its_full_attention_layers(tmp_path):
    shape = shape_of(HYBRID, tmp_path)
    full_attention = shape.layers - len(shape.linear_layers)
    assert full_attention == 6 and shape.attention_layers == full_attention
    s = TrainSetup(stage="grpo", method="lora", precision="bf16", micro_batch=4, seq_len=1024, generations=4,
                   completion_len=512, grad_accum=2)
    batch = s.generation_batch()
    assert kv_cache_bytes(shape, s) == 2 * full_attention * shape.kv_heads * shape.head_dim * 2 * batch * 1024
    # The linear-attention layers: a fixed fp32 recurrent state and the convolution's state per sequence, whatever
    # the length; the KV cache grows with it.
    state = 4 * 16 * 128 * 128 + 2 * (2 * 16 * 128 + 16 * 128) * shape.linear_conv_kernel
    assert linear_state_bytes(shape, s) == len(shape.linear_layers) * state * batch
    longer = replace(s, seq_len=2048)
    assert linear_state_bytes(shape, longer) == linear_state_bytes(shape, s)
    assert kv_cache_bytes(shape, longer) == 2 * kv_cache_bytes(shape, s)
    generation = estimate_grpo(shape, replace(s, micro_batch=1, grad_accum=64))  # 64 completions a call, 1 a pass
    assert generation.moment == "generation" and generation.breakdown["linear_attention_state"] > 0


def test_a_hybrids_linear_attention_layers_have_their_own_terms(tmp_path):
    shape = shape_of(HYBRID, tmp_path)
    attention, linear = layer_activation_bytes(shape, LORA), layer_activation_bytes(shape, LORA, linear=True)
    # Only the linear layers depend on the Gated-DeltaNet's dimensions.
    other = replace(shape, linear_value_heads=32)
    assert layer_activation_bytes(other, LORA) == attention
    assert layer_activation_bytes(other, LORA, linear=True) > linear
    n_linear = len(shape.linear_layers)
    edges = (2 * 2 + 4) * shape.hidden
    assert activation_terms(shape, LORA)["activations"] == pytest.approx(
        LORA.tokens() * ((shape.layers - n_linear) * attention + n_linear * linear + edges))
    # Packed rows: the block-diagonal mask is kept by the attention layers only (linear attention takes none).
    packed = activation_terms(shape, replace(LORA, packed=True))["packed_attention_mask"]
    dense_layers = activation_terms(replace(shape, linear_layers=()), replace(LORA, packed=True))
    assert packed * shape.layers == dense_layers["packed_attention_mask"] * (shape.layers - n_linear)
