"""Merged rollouts' host copy (memory/rollout_host.py, trainer_kit/merged_rollouts.py): counted exactly against the
copy the rollouts take, said in plan.json's `rollout` against the host RAM a worker has, and with `lora.experts`
the routed experts kept unmerged where their copy does not fit (issue 34)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from bench.family_models import QWEN3_MOE_8L
from medgpt_ray.config import GRPOStageConfig, LoraConfig
from medgpt_ray.memory.budget import make_budget
from medgpt_ray.memory.estimator import GIB, TrainSetup
from medgpt_ray.memory.families import shape_from_config
from medgpt_ray.memory.generation import merge_delta_bytes
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.memory.rollout_host import host_copy_bytes
from medgpt_ray.models import lora_config
from medgpt_ray.trainer_kit.merged_rollouts import MergedRollouts, host_copy, lora_layers, merging_behaviour

MOE_8L = shape_from_config(QWEN3_MOE_8L, "qwen3-moe-8l", "bench/family_models.py")
EXPERTS = LoraConfig(rank=8, dropout=0.0, experts=True)
KW = dict(method="lora", lora=EXPERTS, precision="bf16", seq_len=1024, max_completion_length=512, effective_batch=16,
          num_generations=8, grad_ckpt=True, generation_path="dynamic")


def copied_bytes(copies) -> int:
    return sum(t.numel() * t.element_size() for t in copies.values())


@pytest.mark.parametrize("experts", [False, True])
def test_the_host_copy_is_counted_exactly(experts, tmp_path):
    """The bytes merged_rollouts.host_copy takes of a tiny bf16 Qwen3-MoE's PEFT model equal the planner's count,
    with the experts (merged) and without them (lora.experts off, or kept unmerged)."""
    from peft import get_peft_model

    from tests.unit.test_moe_lora_training import tiny_qwen3_moe
    from tests.unit.test_shape_families import shape_of

    model = tiny_qwen3_moe().to(torch.bfloat16)
    shape = shape_of(model.config, tmp_path)
    peft = get_peft_model(model, lora_config(LoraConfig(rank=4, dropout=0.0, experts=experts), "CAUSAL_LM", model))
    s = TrainSetup(stage="grpo", method="lora", precision="bf16", micro_batch=1, seq_len=64, lora_experts=experts,
                   generations=2)
    assert copied_bytes(host_copy(lora_layers(peft))) == host_copy_bytes(shape, s) > 0
    # kept unmerged (the plan's choice without host RAM for the experts): neither copied nor counted
    assert copied_bytes(host_copy(lora_layers(peft, experts=False))) == host_copy_bytes(shape, s, experts=False)


def test_the_host_copy_of_the_tiny_dense_model_counts_its_biases():
    """The repo's tiny Qwen2 (q, k, v biases, every linear adapted under all-linear)."""
    from peft import get_peft_model

    from medgpt_ray.memory.shapes import load_shape
    from medgpt_ray.models import load_causal_lm
    from medgpt_ray.tiny import ensure_tiny

    model = load_causal_lm(ensure_tiny(), "bf16", "lora")
    peft = get_peft_model(model, lora_config(LoraConfig(rank=4, dropout=0.0), "CAUSAL_LM", model))
    shape = load_shape("tiny")
    s = TrainSetup(stage="grpo", method="lora", precision="bf16", micro_batch=1, seq_len=64, generations=2)
    assert shape.qkv_bias and copied_bytes(host_copy(lora_layers(peft))) == host_copy_bytes(shape, s)
    assert host_copy_bytes(shape, replace(s, precision="fp32")) == 2 * host_copy_bytes(shape, s)


def test_the_8_layer_moe_copies_9_gib_of_experts_per_worker():
    s = TrainSetup(stage="grpo", method="lora", precision="bf16", micro_batch=1, seq_len=64, lora_experts=True,
                   generations=2)
    assert MOE_8L.expert_params == 8 * 128 * 3 * 2048 * 768
    assert host_copy_bytes(MOE_8L, s) / GIB == pytest.approx(9.0 + 0.28, abs=0.01)  # experts + attention
    assert host_copy_bytes(MOE_8L, s, experts=False) / GIB == pytest.approx(0.28, abs=0.01)


def plan(host_gib: float | None):
    budget = make_budget(140, 2, "h200", True, "test", host_gib=host_gib, gpus_per_node=2)
    return plan_stage("grpo", GRPOStageConfig(**KW), 2, True, shape=MOE_8L, budget=budget)


def test_the_rollout_line_says_the_host_ram_and_keeps_the_experts_unmerged_where_it_is_short():
    # 64 GiB on a node of two workers: 80 % of it, 25.6 GiB each, holds the 9.28 GiB copy
    roomy = plan(64).rollout
    assert roomy.startswith("merged LoRA (") and "unmerged" not in roomy
    assert "host RAM: 9.28 GiB per worker for the base's copy (of 25.60 GiB a worker has)" in roomy
    # 16 GiB: 6.4 GiB each, less than the experts' copy: they stay unmerged, the attention's 0.28 GiB is copied
    short = plan(16).rollout
    assert short.startswith("merged LoRA, the routed experts' adapters unmerged (")
    assert re.search(r"host RAM: 0\.28 GiB per worker .*\(of 6\.40 GiB a worker has\); merging the experts too "
                     r"would copy 9\.28 GiB per worker, more than that", short)
    assert "not checked" in plan(None).rollout and "unmerged" not in plan(None).rollout


def test_the_merge_transient_and_the_trainer_behaviour_follow_the_plan():
    s = TrainSetup(stage="grpo", method="lora", precision="bf16", micro_batch=1, seq_len=64, lora_experts=True,
                   generations=2)
    unmerged = replace(s, merge_experts=False)
    assert merge_delta_bytes(MOE_8L, s) == 2 * 4 * 128 * 2 * 768 * 2048  # a routed layer's fused gate_up
    assert merge_delta_bytes(MOE_8L, unmerged) < merge_delta_bytes(MOE_8L, s) / 10
    (kept,) = merging_behaviour(plan(16).rollout, MergedRollouts)
    assert issubclass(kept, MergedRollouts) and kept.merge_experts is False
    assert merging_behaviour(plan(64).rollout, MergedRollouts) == (MergedRollouts,)
    assert merging_behaviour("unmerged adapters (a 4-bit QLoRA base takes no merge)", MergedRollouts) == ()


def test_a_rollout_without_the_experts_merges_the_dense_layers_and_runs_the_experts_adapted():
    """merge_experts False: inside the block the attention's base is merged and the fused experts are untouched
    (PEFT's ParamWrapper folds their adapters on the fly), the logits equal the unmerged model's; after it, every
    base tensor is as before."""
    from peft import get_peft_model

    from medgpt_ray.trainer_kit.merged_rollouts import merged_adapters
    from tests.unit.test_moe_lora_training import tiny_qwen3_moe

    model = tiny_qwen3_moe()
    peft = get_peft_model(model, lora_config(LoraConfig(rank=4, dropout=0.0, experts=True), "CAUSAL_LM", model))
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if ".lora_B." in n:
                p.normal_(std=0.1)  # a trained adapter (PEFT starts B at zero)
    peft.eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        want = peft(input_ids=ids).logits
    base = {n: p.detach().clone() for n, p in peft.named_parameters() if "lora_" not in n}
    layers = lora_layers(peft, experts=False)
    with merged_adapters(layers, host_copy(layers)), torch.no_grad():
        now = dict(peft.named_parameters())
        assert all(torch.equal(now[n], base[n]) for n in base if n.endswith(("gate_up_proj", "down_proj"))
                   and ".experts." in n)
        assert not torch.equal(now["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"],
                               base["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])
        torch.testing.assert_close(peft(input_ids=ids).logits, want, atol=1e-5, rtol=1e-4)
    assert all(torch.equal(p, base[n]) for n, p in peft.named_parameters() if n in base)
