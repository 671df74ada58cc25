"""Issue 34: what the planner may choose for a family is what runs on it. A hybrid (Qwen3.5) model is planned padded on
`packing: auto` and never compiled on `auto`; liger-kernel's coverage of each family decides whether Liger's layer
kernels or fused CE can stand behind an estimate (found on the H200: Liger raises on Qwen3.5's RoPE)."""

from __future__ import annotations

import json

import pytest

from medgpt_ray.config import ConfigError, LoraConfig, SFTStageConfig
from medgpt_ray.memory.budget import make_budget
from medgpt_ray.memory.lengths import LengthProfile
from medgpt_ray.memory.options import compiles
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.memory.shapes import PRESETS, load_shape

CARD = make_budget(24, 2, "rtx4090", True, "test")
QWEN3_5_TEXT = {"model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 1024, "intermediate_size": 3584,
                "num_hidden_layers": 24, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
                "linear_num_key_heads": 16, "linear_num_value_heads": 16, "tie_word_embeddings": True}


def shape_of(tmp_path, settings: dict):
    (tmp_path / "config.json").write_text(json.dumps(settings))
    return load_shape(str(tmp_path))


def sft(**kw) -> SFTStageConfig:
    return SFTStageConfig(method="lora", lora=LoraConfig(rank=8), precision="bf16", seq_len=2048, effective_batch=32,
                          **kw)


PACKED = LengthProfile.of([40] * 900 + [400] * 100, records=1000, seq_len=2048, conversations_per_row=8.0)


def test_a_hybrid_is_planned_padded_on_auto_and_packed_only_when_asked(tmp_path):
    hybrid = shape_of(tmp_path, QWEN3_5_TEXT)
    padded = plan_stage("sft", sft(), 1, True, hybrid, CARD, PACKED)
    assert padded.packing is None
    assert any("planned padded: 18 of 24 layers are linear attention" in r for r in padded.reasons)
    # The same data on a dense model of the same size is packed; `packing: true` keeps the hybrid packed (the
    # worker then packs on the boundary-aware kernels or stops with the reason).
    assert plan_stage("sft", sft(), 1, True, PRESETS["qwen2.5-0.5b"], CARD, PACKED).packing is not None
    assert plan_stage("sft", sft(packing=True), 1, True, hybrid, CARD, PACKED).packing is not None


def test_a_hybrid_is_not_compiled_on_auto(tmp_path):
    hybrid, dense = shape_of(tmp_path, QWEN3_5_TEXT), PRESETS["qwen2.5-0.5b"]
    assert compiles(sft(), True, "lora", 0, dense) and not compiles(sft(), True, "lora", 0, hybrid)
    assert compiles(sft(compile=True), True, "lora", 0, hybrid)  # explicit wins
    assert not plan_stage("sft", sft(), 1, True, hybrid, CARD).compile


def test_liger_coverage_is_the_familys(tmp_path):
    hybrid = shape_of(tmp_path, QWEN3_5_TEXT)
    assert not hybrid.liger_layers and hybrid.liger_fused_ce
    moe = {"model_type": "qwen2_moe", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 4}
    qwen2_moe = shape_of(tmp_path, moe)
    assert not qwen2_moe.liger_layers and not qwen2_moe.liger_fused_ce
    dense = shape_of(tmp_path, {**moe, "model_type": "qwen3"})
    assert dense.liger_layers and dense.liger_fused_ce


def test_fused_kernels_on_a_hybrid_need_an_explicit_compile(tmp_path):
    """Neither Liger (no RoPE for Qwen3.5) nor compile on `auto` (a hybrid stays eager) would fuse its layers: an
    explicit `fused_kernels: true` is refused with the key, and fits once compile is asked for."""
    hybrid = shape_of(tmp_path, QWEN3_5_TEXT)
    with pytest.raises(ConfigError, match="stages.sft.fused_kernels: .*this model's family"):
        plan_stage("sft", sft(fused_kernels=True), 1, True, hybrid, CARD)
    assert plan_stage("sft", sft(fused_kernels=True, compile=True), 1, True, hybrid, CARD).fused_kernels


def test_the_measured_delta_rule_excess_is_counted_in_every_live_linear_layer(tmp_path):
    """The H200 measured ~3 fp32 recurrent states a token in the rebuilt layer beyond what a fake-tensor trace of the
    same code holds (bench/README.md, "fake_trace.py"): counted once under full checkpointing, per live linear layer
    otherwise, never for a dense model."""
    from medgpt_ray.memory.estimator import TrainSetup, estimate

    hybrid = shape_of(tmp_path, QWEN3_5_TEXT)
    state = 4 * hybrid.linear_value_heads * hybrid.linear_key_head_dim * hybrid.linear_value_head_dim

    def term(shape, ckpt: float) -> float:
        setup = TrainSetup(stage="sft", method="lora", precision="bf16", micro_batch=1, seq_len=2048,
                           ckpt_fraction=ckpt, fused_ce=True, zero=0, offload="none", gpus=1, optim="adamw")
        return estimate(shape, setup).breakdown.get("linear_attention_fallback", 0.0)

    assert term(hybrid, 1.0) == 2048 * 3 * state
    assert term(hybrid, 0.0) == 2048 * 3 * state * len(hybrid.linear_layers)
    assert term(PRESETS["qwen2.5-0.5b"], 1.0) == 0.0


def test_the_pytorch_delta_rule_is_priced_as_the_launch_bound_loop_it_is(tmp_path):
    """Without flash-linear-attention (not installed here) a hybrid's linear layers cost a fixed number of ops a pass
    plus some per 64-token chunk; a dense model of the same size pays none of it."""
    from medgpt_ray.memory.estimator import TrainSetup
    from medgpt_ray.memory.throughput import delta_rule_ops, fla_installed, spec_for, tokens_per_second

    assert not fla_installed()
    hybrid = shape_of(tmp_path, QWEN3_5_TEXT)
    (tmp_path / "dense").mkdir()
    same_size = {k: v for k, v in QWEN3_5_TEXT.items() if not k.startswith("linear")}
    dense = shape_of(tmp_path / "dense", {**same_size, "model_type": "qwen3"})
    assert delta_rule_ops(dense, 2048) == 0
    assert delta_rule_ops(hybrid, 2048) - delta_rule_ops(hybrid, 1024) == 18 * 21 * 16  # 16 more chunks, 18 layers
    setup = TrainSetup(stage="sft", method="lora", precision="bf16", micro_batch=1, seq_len=2048, ckpt_fraction=1.0,
                       fused_ce=True, zero=0, offload="none", gpus=1, optim="adamw")
    h200 = spec_for("NVIDIA H200")
    assert tokens_per_second(hybrid, setup, h200) < tokens_per_second(dense, setup, h200) / 5
