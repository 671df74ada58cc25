"""RLOO's memory plan (memory kind grpo, memory/generation.py): GRPO's two phases with the reward model network always
resident (the rm stage's merged model, beside the policy) and the reference; the plan says where the reward model is,
a refusal lists the hints with numbers, among them a GPU of its own for the reward model (reward_model_gpu), and that
key plans the policy's GPU without it and checks the reward model's own GPU."""

from __future__ import annotations

import pytest

from medgpt_ray.config import GRPOStageConfig, LoraConfig, RLOOStageConfig
from medgpt_ray.memory.budget import make_budget
from medgpt_ray.memory.estimator import GIB
from medgpt_ray.memory.format import format_plan, plan_line
from medgpt_ray.memory.planner import PlanError, plan_stage
from medgpt_ray.memory.shapes import PRESETS

Q7 = PRESETS["qwen2.5-7b"]
KW = dict(method="lora", lora=LoraConfig(rank=8), precision="bf16", seq_len=1024, max_completion_length=512,
          effective_batch=16, num_generations=8, grad_ckpt=True, beta=0.05,
          generation_path="dynamic")  # the dynamic path's numbers (the static one keeps its cache: test_decode_path)
RM_GIB = 2 * (Q7.params - Q7.head_params + Q7.hidden) / GIB  # the merged 7B score model in bf16: 13.17 GiB


def test_the_reward_network_is_counted_against_the_same_grpo_setup_without_it():
    budget = make_budget(80.0, 2.0, "h100", True, "t")
    rloo = plan_stage("rloo", RLOOStageConfig(**KW, micro_batch=1), 1, True, Q7, budget)
    grpo = plan_stage("grpo", GRPOStageConfig(**KW, micro_batch=1, reward_funcs=["accuracy"]), 1, True, Q7, budget)
    assert (rloo.micro_batch, rloo.grad_accum, rloo.ckpt_fraction) == (grpo.micro_batch, grpo.grad_accum, 1.0)
    assert rloo.prediction.peak_gib - grpo.prediction.peak_gib == pytest.approx(RM_GIB, abs=0.002)
    assert rloo.prediction.breakdown_gib["reward_model"] == pytest.approx(13.17, abs=0.01)
    assert "reward_model" not in grpo.prediction.breakdown_gib
    # The plan says which device holds it (today: beside the policy on the worker's GPU), and so does its log line.
    assert rloo.reward_model_on == "the GPU of each training worker, beside the policy (13.17 GiB)"
    assert grpo.reward_model_on is None
    assert "; reward model on the GPU of each training worker, beside the policy (13.17 GiB)" in plan_line(rloo)
    assert "  reward model: on the GPU of each training worker, beside the policy (13.17 GiB)" in format_plan(rloo)
    assert not any("reward model" in row for row in format_plan(grpo))


def test_full_training_with_a_kl_term_counts_a_frozen_reference():
    budget = make_budget(141.0, 2.0, "h200", True, "t")
    full = {**KW, "method": "full", "precision": "bf16", "micro_batch": 1}
    with_ref = plan_stage("rloo", RLOOStageConfig(**full), 1, True, Q7, budget)
    without = plan_stage("rloo", RLOOStageConfig(**{**full, "beta": 0.0}), 1, True, Q7, budget)
    assert with_ref.prediction.breakdown_gib["reference_model"] == pytest.approx(2 * Q7.params / GIB, abs=0.01)
    assert "reference_model" not in without.prediction.breakdown_gib
    assert with_ref.prediction.peak_gib - without.prediction.peak_gib == pytest.approx(2 * Q7.params / GIB, abs=0.01)


def test_7b_lora_rloo_at_24_gib_is_refused_with_the_hints_and_their_numbers():
    rtx4090 = make_budget(24.0, 2.0, "rtx4090", True, "t")
    with pytest.raises(PlanError) as err:
        plan_stage("rloo", RLOOStageConfig(**KW), 1, True, Q7, rtx4090)
    # Two merged 7B networks (policy base 14.3 GiB, reward model 13.2 GiB) cannot share a 24 GiB card.
    # The generate calls already hold one group of 8 each (the planner's smallest generation batch): the training
    # pass over policy and reward model decides.
    for line in ("stages.rloo: nothing fits 22.0 GiB", "smallest predicted peak: 28.9 GiB",
                 "num_generations 4 (same prompts per step): 28.6 GiB (still over)",
                 "max_completion_length 256: 28.8 GiB (still over)", "method qlora: 19.9 GiB (fits)",
                 "reward_model_gpu: true (the reward model on a GPU of its own): 15.8 GiB (fits)"):
        assert line in str(err.value), line
    # The last: the policy's GPU without the reward model, the smallest peak less the reward model's 13.17 GiB.
    assert err.value.smallest_peak_gib - RM_GIB == pytest.approx(15.76, abs=0.05)


def test_on_cpu_the_reward_model_is_in_each_workers_memory():
    plan = plan_stage("rloo", RLOOStageConfig(), 1, False)  # the tiny model: its score model is about a MiB
    assert plan.reward_model_on == "the CPU memory of each training worker, beside the policy (1.1 MiB)"


def test_with_reward_model_gpu_7b_lora_rloo_fits_24_gib_and_the_reward_model_is_planned_on_its_own_gpu():
    rtx4090 = make_budget(24.0, 2.0, "rtx4090", True, "t")
    plan = plan_stage("rloo", RLOOStageConfig(**KW, reward_model_gpu=True), 1, True, Q7, rtx4090)
    assert plan.prediction.peak_gib <= 22.0 and "reward_model" not in plan.prediction.breakdown_gib
    # Where it is and what its own GPU must hold: the network and one scoring forward of 16 x seq_len tokens.
    assert plan.reward_model_on.startswith("a GPU of its own (a Ray actor; the placement picks it): 13.17 GiB, ")
    own = float(plan.reward_model_on.split(", ")[-1].split(" GiB")[0])
    assert RM_GIB < own < 22.0
    assert plan.reward_model_gpu is None  # the GPU itself: the placement's (run/gpu_placement.place_reward_model)


def test_a_reward_model_too_big_for_its_own_gpu_is_refused_with_the_numbers():
    small = make_budget(16.0, 2.0, "t", True, "t")
    with pytest.raises(PlanError, match=r"stages\.rloo\.reward_model_gpu: the reward model's own GPU needs "
                                        r"1[45]\.\d GiB \(network 13\.17 GiB, scoring 16 x 1024 tokens\) of "
                                        r"14\.0 GiB usable"):
        plan_stage("rloo", RLOOStageConfig(**{**KW, "method": "qlora"}, reward_model_gpu=True), 1, True, Q7, small)


def test_reward_model_gpu_needs_a_reward_model():
    with pytest.raises(ValueError, match="reward_model_gpu: true places the reward model, and reward_funcs"):
        GRPOStageConfig(reward_funcs=["accuracy"], reward_model_gpu=True)

