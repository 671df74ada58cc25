"""GRPO's memory model (memory/generation.py): the larger of the generation phase (weights, optimizer states, the
KV cache of one generate call, the reward model network) and the training pass over prompt + completion; the
planner refuses with numbers and GRPO's own hints (fewer generations, shorter completions, QLoRA)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from medgpt_ray.config import GRPOStageConfig, LoraConfig
from medgpt_ray.memory.budget import make_budget
from medgpt_ray.memory.estimator import GIB, TrainSetup
from medgpt_ray.memory.generation import kv_cache_bytes, merge_delta_bytes
from medgpt_ray.memory.generation import peak as estimate
from medgpt_ray.memory.planner import PlanError, plan_stage
from medgpt_ray.memory.shapes import PRESETS

Q7 = PRESETS["qwen2.5-7b"]
# The dynamic decode path's phases: the static path also holds its cache in training (tests/unit/test_decode_path.py).
KW = dict(method="lora", lora=LoraConfig(rank=8), precision="bf16", seq_len=1024, max_completion_length=512,
          effective_batch=64, num_generations=8, grad_ckpt=True, generation_path="dynamic")
SETUP = TrainSetup(stage="grpo", method="lora", precision="bf16", micro_batch=1, grad_accum=64, seq_len=1024,
                   fused_ce=True, generations=8, completion_len=512)


def test_the_kv_cache_of_one_generate_call():
    # 2 (K, V) x 28 layers x 4 KV heads x 128 x 2 bytes x 64 completions x 1024 tokens = 3.5 GiB
    assert kv_cache_bytes(Q7, SETUP) / GIB == pytest.approx(2 * 28 * 4 * 128 * 2 * 64 * 1024 / GIB)
    assert kv_cache_bytes(Q7, SETUP) / GIB == pytest.approx(3.5)


def test_the_peak_is_the_larger_phase_and_a_reward_network_adds_its_weights():
    e = estimate(Q7, SETUP)
    assert e.moment == "generation" and e.breakdown_gib()["kv_cache"] == pytest.approx(3.5, abs=0.01)
    training = estimate(Q7, replace(SETUP, generations=0))  # the training pass alone
    assert e.peak_gib > training.peak_gib
    # fewer completions per generate call: the training pass decides
    small = estimate(Q7, replace(SETUP, grad_accum=1))
    assert small.moment.startswith("training")
    with_rm = estimate(Q7, replace(SETUP, reward_network=True))
    assert with_rm.peak_gib - e.peak_gib == pytest.approx(2 * (Q7.params - Q7.head_params + Q7.hidden) / GIB)


def test_the_merged_rollout_moment_is_priced_for_lora_only():
    # PEFT's merge of the widest adapted layer (down/up/gate: 18944 x 3584) holds B @ A and its scaled copy in fp32.
    assert merge_delta_bytes(Q7, SETUP) == 2 * 4 * 18944 * 3584
    assert merge_delta_bytes(Q7, replace(SETUP, method="qlora")) == 0  # QLoRA and ZeRO-3 generate unmerged
    assert merge_delta_bytes(Q7, replace(SETUP, zero=3)) == 0
    # One completion of 16 tokens a call: the merge moment (0.5 GiB of deltas) is above the generate call itself.
    tiny_call = replace(SETUP, grad_accum=1, generations=1, completion_len=16, seq_len=64)
    e = estimate(Q7, tiny_call)
    assert e.moment == "rollout merge" and e.breakdown_gib()["lora_merge_delta"] == pytest.approx(0.506, abs=0.001)


def test_7b_lora_grpo_at_24_gib_samples_in_smaller_generate_calls_when_one_call_does_not_fit():
    rtx4090 = make_budget(24.0, 2.0, "rtx4090", True, "t")
    plan = plan_stage("grpo", GRPOStageConfig(**KW), 1, True, Q7, rtx4090)
    assert plan.prediction.peak_gib <= 22.0 and plan.micro_batch * plan.grad_accum == 64
    # All 64 completions in one generate call (TRL's default) would not fit: the planner splits the step's
    # sampling into calls of whole groups (steps_per_generation micro-batches each).
    calls = plan.grad_accum // plan.steps_per_generation
    batch = plan.micro_batch * plan.steps_per_generation
    assert calls > 1 and batch % 8 == 0
    one_call = replace(plan.train_setup(GRPOStageConfig(**KW)), gen_steps=plan.grad_accum)
    assert estimate(Q7, one_call).peak_gib > 22.0 and estimate(Q7, one_call).moment == "generation"
    chosen = plan.train_setup(GRPOStageConfig(**KW))
    assert kv_cache_bytes(Q7, chosen) / GIB == pytest.approx(3.5 * batch / 64, abs=0.01)
    assert estimate(Q7, chosen).peak_gib == pytest.approx(plan.prediction.peak_gib, abs=0.01)


def test_a_plan_that_fits_samples_the_whole_step_in_one_generate_call():
    # Each call costs completion_len decode steps whatever its batch (memory/throughput.decode_step_seconds):
    # the largest generation batch that fits is the fastest.
    plan = plan_stage("grpo", GRPOStageConfig(**{**KW, "effective_batch": 32}), 1, True, Q7,
                      make_budget(48.0, 2.0, "t", True, "t"))
    assert plan.steps_per_generation == plan.grad_accum


def test_7b_lora_grpo_is_refused_with_numbers_and_what_would_fit_when_even_one_group_per_call_is_too_big():
    with pytest.raises(PlanError) as err:
        plan_stage("grpo", GRPOStageConfig(**{**KW, "seq_len": 4096, "max_completion_length": 2048}), 1, True, Q7,
                   make_budget(20.0, 2.0, "t", True, "t"))
    text = str(err.value)
    assert "nothing fits 18.0 GiB" in text and "smallest predicted peak:" in text
    assert "num_generations 4 (same prompts per step):" in text and "method qlora:" in text
    assert "max_completion_length 1024:" in text


def test_7b_lora_grpo_fits_with_fewer_generations_and_the_plan_says_why():
    plan = plan_stage("grpo", GRPOStageConfig(**{**KW, "effective_batch": 32}), 1, True, Q7,
                      make_budget(24.0, 2.0, "rtx4090", True, "t"))
    # 32 completions per generate call: 1.75 GiB of KV cache; the planner's choice peaks within the budget
    assert plan.prediction.peak_gib <= 22.0 and plan.micro_batch * plan.grad_accum == 32


def test_a_merged_rollout_decode_step_is_priced_without_adapter_kernels():
    # Issue 35's probe on the H200 (Qwen2.5-1.5B, LoRA r8 on all linear layers, 16 sequences, transformers 5.17):
    # 127 ms a decode step with the adapters unmerged, 37 ms merged. LoRA rollouts merge (trainer_kit/
    # merged_rollouts.py); a QLoRA base cannot, so its step keeps PEFT's kernels.
    from medgpt_ray.memory.throughput import GPU_SPECS, decode_step_seconds

    q15, h200 = PRESETS["qwen2.5-1.5b"], GPU_SPECS["h200"]
    rollout = replace(SETUP, micro_batch=16, grad_accum=1, completion_len=256)
    merged = decode_step_seconds(q15, rollout, h200)
    unmerged = decode_step_seconds(q15, replace(rollout, method="qlora"), h200)
    assert merged == pytest.approx(0.037, rel=0.25)
    assert unmerged == pytest.approx(0.127, rel=0.3)
    assert decode_step_seconds(q15, replace(rollout, zero=3), h200) == unmerged  # ZeRO-3 keeps them unmerged


def test_a_step_that_cannot_hold_whole_groups_on_each_worker_is_refused_naming_the_keys():
    from medgpt_ray.config import ConfigError

    cfg = GRPOStageConfig(**{**KW, "effective_batch": 16, "num_generations": 8})
    with pytest.raises(ConfigError, match=r"stages\.grpo\.effective_batch: 16 completions a step over 4 workers is 4 "
                                          r"each.*multiple of 32, or a num_generations that divides 4"):
        plan_stage("grpo", cfg, 4, True, Q7, make_budget(24.0, 2.0, "t", True, "t"))
    plan_stage("grpo", GRPOStageConfig(**{**KW, "effective_batch": 32, "num_generations": 8}), 4, True, Q7,
               make_budget(48.0, 2.0, "t", True, "t"))  # whole groups on every worker: planned
