"""Issue 34 item 2, `lora.experts`: the routed experts adapted through PEFT's `target_parameters`, counted exactly (a
rank-r pair per expert on each fused tensor) against PEFT on the meta-device model, the router left frozen, and
refused with the key named where it cannot run."""

from __future__ import annotations

import re

import pytest
import transformers as tf

from medgpt_ray.config import ConfigError, LoraConfig, StageConfig
from medgpt_ray.memory.budget import make_budget
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.memory.shapes import PRESETS
from medgpt_ray.models import lora_config
from tests.unit.test_shape_families import CONFIGS, count, meta_model, peft_on, shape_of

MOE_FAMILIES = ["qwen2_moe", "qwen3_moe", "qwen3_5_moe_text"]
EXPERTS = LoraConfig(rank=4, dropout=0.0, experts=True)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_expert_adapters_count_exactly_what_peft_trains(family, tmp_path):
    cfg = CONFIGS[family]()
    shape = shape_of(cfg, tmp_path)
    peft = peft_on(cfg, EXPERTS)
    experts = sum(p.numel() for n, p in peft.named_parameters() if p.requires_grad and ".mlp.experts." in n)
    assert experts == shape.expert_lora_params(4) > 0
    assert shape.lora_params(4, experts=True) == count(peft, trainable=True)
    assert shape.lora_params(4) == count(peft_on(cfg, LoraConfig(rank=4, dropout=0.0)), trainable=True)


def test_each_expert_has_its_own_rank_r_pair_and_the_router_stays_frozen():
    peft = peft_on(CONFIGS["qwen3_moe"](), EXPERTS)  # 6 experts, hidden 64, moe_intermediate 40
    shapes = {n.split("layers.1.")[1]: tuple(p.shape) for n, p in peft.named_parameters()
              if p.requires_grad and "layers.1.mlp" in n}
    # gate_up_proj (6, 80, 64): A is (r*E, 64), B (80, r*E); down_proj (6, 64, 40): A (r*E, 40), B (64, r*E).
    assert sorted(shapes.values()) == sorted([(24, 64), (80, 24), (24, 40), (64, 24)])
    frozen = [n for n, p in peft.named_parameters() if "mlp.gate." in n or n.endswith("mlp.gate.weight")]
    assert frozen and not any(p.requires_grad for n, p in peft.named_parameters() if n in frozen)


def test_the_composite_qwen3_5_moe_counts_its_expert_adapters(tmp_path):
    cfg = tf.Qwen3_5MoeConfig(text_config=CONFIGS["qwen3_5_moe_text"]().to_dict())
    assert shape_of(cfg, tmp_path).lora_params(4, experts=True) == count(peft_on(cfg, EXPERTS), trainable=True)


def test_the_loader_refuses_experts_on_a_dense_model_and_pefts_dropout():
    with pytest.raises(ValueError, match=r"lora.experts: the model \(qwen3\) has no routed experts"):
        lora_config(EXPERTS, "CAUSAL_LM", meta_model(CONFIGS["qwen3"]()))
    with pytest.raises(ValueError, match="lora.experts needs lora.dropout 0"):
        LoraConfig(experts=True, dropout=0.05)  # PEFT's expert adapters raise on any dropout
    assert LoraConfig(experts=True).dropout == 0.0 and LoraConfig().dropout == 0.05  # unset: 0 with the key
    off = lora_config(LoraConfig(rank=4), "CAUSAL_LM", meta_model(CONFIGS["qwen3_moe"]()))
    assert off.target_parameters is None  # the key off: exactly the targets as before


def stage(**kw) -> StageConfig:
    return StageConfig(**{"lora": {"rank": 8, "dropout": 0.0, "experts": True}, "seq_len": 512, **kw})


def test_the_planner_refuses_experts_where_they_cannot_run():
    with pytest.raises(ConfigError, match="stages.sft.lora.experts: qwen2.5-0.5b has no routed experts"):
        plan_stage("sft", stage(), 1, False, shape=PRESETS["qwen2.5-0.5b"])
    with pytest.raises(ConfigError, match="stages.sft.lora.experts: not with zero_stage 3"):
        plan_stage("sft", stage(zero_stage=3), 2, False, shape=PRESETS["qwen3-30b-a3b"])
    with pytest.raises(ConfigError, match="stages.sft.lora.experts: method 'full'"):
        plan_stage("sft", stage(method="full"), 1, False, shape=PRESETS["qwen3-30b-a3b"])


def test_expert_adapters_are_not_fused_by_liger_nor_compiled_on_auto(monkeypatch):
    """The H100 run of lora.experts (bench/results/real_length_throughput_qwen3-moe-8l_lora_experts_liger_failure_
    h100.json): PEFT wraps the adapted experts, Liger's SwiGLU then fails on them. Eager layers are left as they are,
    whether liger-kernel is installed or not; compiled ones still fuse when compile is asked for."""
    from medgpt_ray.memory import options

    moe, budget = PRESETS["qwen3-30b-a3b"], make_budget(140, 2, "rtx4090", True, "test")
    for installed in (False, True):
        monkeypatch.setattr(options, "liger_available", lambda installed=installed: installed)
        on = plan_stage("sft", stage(), 4, True, shape=moe, budget=budget)
        assert not on.fused_kernels and not on.compile
        assert any("fused_kernels: searched [False]" in r for r in on.reasons)
        off = plan_stage("sft", stage(lora={"rank": 8, "dropout": 0.0}), 4, True, shape=moe, budget=budget)
        assert any("fused_kernels: searched [False, True]" in r for r in off.reasons)
    with pytest.raises(ConfigError, match="fused_kernels: not with lora.experts unless compile is true"):
        plan_stage("sft", stage(fused_kernels=True), 4, True, shape=moe, budget=budget)
    assert plan_stage("sft", stage(fused_kernels=True, compile=True), 4, True, shape=moe, budget=budget).fused_kernels


def test_the_planner_counts_the_expert_adapters_and_never_searches_zero3_with_them():
    moe = PRESETS["qwen3-30b-a3b"]
    budget = make_budget(140, 2, "rtx4090", True, "test")  # room for the whole model on each of 4 workers
    off = plan_stage("sft", stage(lora={"rank": 8, "dropout": 0.0}), 4, True, shape=moe, budget=budget)
    on = plan_stage("sft", stage(), 4, True, shape=moe, budget=budget)
    assert on.zero_stage != 3 and "expert_lora_fold" in on.prediction.breakdown_gib
    assert "expert_lora_fold" not in off.prediction.breakdown_gib
    # 48 layers x 128 experts x 8 x (2 x 2048 + 3 x 768) adapter weights: 0.315 B more trained in fp32
    assert moe.expert_lora_params(8) == 48 * 128 * 8 * (2 * 2048 + 3 * 768)


def test_rollouts_merge_the_expert_adapters_and_restore_the_experts_bit_identical():
    """trainer_kit/merged_rollouts.py (grpo, rloo, opd generate on merged weights): PEFT's merge folds the expert
    adapters into the fused tensors for the rollout, and the bf16 experts are written back exactly after it."""
    import torch
    from peft import get_peft_model

    from medgpt_ray.trainer_kit.merged_rollouts import host_copy, lora_layers, merged_adapters
    from tests.unit.test_moe_lora_training import tiny_qwen3_moe

    model = tiny_qwen3_moe().to(torch.bfloat16)
    peft = get_peft_model(model, lora_config(LoraConfig(rank=4, dropout=0.0, experts=True), "CAUSAL_LM", model))
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if ".lora_B." in n:
                p.normal_()  # a trained adapter (PEFT starts B at zero: a merge would change nothing)
    fused = ("base_layer.gate_up_proj", "base_layer.down_proj")
    experts = {n: p for n, p in peft.named_parameters() if n.endswith(fused)}
    before = {n: p.detach().clone() for n, p in experts.items()}
    layers = lora_layers(peft)
    assert sum(".mlp.experts" in name for name in layers) == 2 * 2  # two wrappers (gate_up, down) a layer
    with merged_adapters(layers, host_copy(layers)):
        assert all(not torch.equal(p, before[n]) for n, p in experts.items())
    assert all(torch.equal(p, before[n]) for n, p in experts.items())


def test_a_moe_that_needs_zero3_is_refused_with_experts_and_the_hint_drops_them():
    """Qwen3-30B-A3B on 4 x 24 GB fits only with ZeRO-3 (configs/qwen3-30b-a3b-4x4090.yaml), which lora.experts is
    refused with: nothing fits, and the ZeRO-3 hints say they are without the expert adapters."""
    from medgpt_ray.memory.candidates import PlanError

    with pytest.raises(PlanError, match="nothing fits") as refused:
        plan_stage("sft", stage(seq_len=2048), 4, True, shape=PRESETS["qwen3-30b-a3b"],
                   budget=make_budget(24, 2, "rtx4090", True, "test"))
    assert re.search(r"lora.experts false, (method lora \(bf16\), )?ZeRO-3", str(refused.value))
    # Without the key the stage's own 4 GPUs are enough (the config's plan): the hint says so, not 8.
    assert re.search(r"lora.experts false, (method lora \(bf16\), )?ZeRO-3 over 4 GPUs: [\d.]+ GiB \(fits\)",
                     str(refused.value))


def test_the_estimate_command_takes_lora_experts_and_refuses_it_with_zero3(capsys):
    from medgpt_ray.cli import main

    args = ["estimate", "--model", "qwen3-30b-a3b", "--stage", "sft", "--method", "lora", "--precision", "bf16",
            "--micro-batch", "1", "--seq-len", "2048", "--grad-ckpt", "--fused-ce", "--json"]
    assert main(args) == 0 and "expert_lora_fold" not in capsys.readouterr().out
    assert main([*args, "--lora-experts"]) == 0 and "expert_lora_fold" in capsys.readouterr().out
    assert main([*args, "--lora-experts", "--zero", "3", "--gpus", "4"]) == 2
    assert "lora.experts) needs method lora or qlora, without ZeRO-3" in capsys.readouterr().err


def test_layers_with_expert_adapters_are_not_compiled_on_auto():
    from medgpt_ray.memory.options import compiles

    moe = PRESETS["qwen3-30b-a3b"]
    assert compiles(stage(lora={"rank": 8}), True, "lora", 0, moe)
    assert not compiles(stage(), True, "lora", 0, moe)
    assert compiles(stage(compile=True), True, "lora", 0, moe)  # asked for: it runs, with graph breaks
