"""reward_shared_base: resolved by the pipeline config (the rm trains with LoRA from the online-RL stage's `from`),
and planned as the rm's adapter + score head + one scoring forward beside the policy, not a second network (memory/
generation.py): the 7B LoRA rloo a 24 GiB card refuses with a separate reward model fits with the shared base."""

from __future__ import annotations

import pytest

from medgpt_ray.config import LoraConfig, RLOOStageConfig, load_config
from medgpt_ray.memory.budget import make_budget
from medgpt_ray.memory.estimator import GIB
from medgpt_ray.memory.format import format_plan
from medgpt_ray.memory.planner import PlanError, plan_stage
from medgpt_ray.memory.shapes import PRESETS

Q7 = PRESETS["qwen2.5-7b"]
KW = dict(method="lora", lora=LoraConfig(rank=8), precision="bf16", seq_len=1024, max_completion_length=512,
          effective_batch=16, num_generations=8, grad_ckpt=True, beta=0.05,
          generation_path="dynamic")  # the dynamic path's numbers (the static one keeps its cache: test_decode_path)
LORA = ["stages.rm.method=lora", "stages.rloo.method=lora"]


def rl_config(repo, *sets: str):
    return load_config(repo / "configs/tiny-cpu-rl.yaml", sets=list(sets))


def test_auto_shares_the_base_when_rm_trains_with_lora_from_the_same_stage(repo):
    assert rl_config(repo, *LORA).stages.get("rloo").reward_shared_base is True
    # method auto is LoRA or QLoRA, never full: shared too
    assert rl_config(repo, "stages.rm.method=auto", "stages.rloo.method=auto").stages.get("rloo").reward_shared_base
    # grpo with the reward_model reward follows the same rule
    grpo = rl_config(repo, *LORA, "stages.grpo.method=lora", "stages.grpo.reward_funcs=[accuracy, reward_model]")
    assert grpo.stages.get("grpo").reward_shared_base is True


@pytest.mark.parametrize("sets, blocker", [
    (["stages.rloo.method=lora"], "the rm stage trains in full"),
    (["stages.rm.method=lora"], "this stage trains in full"),
    ([*LORA, "stages.rloo.from=pt", "stages.pt.enabled=true"], "the rm stage starts from sft, this stage from pt"),
    ([*LORA, "stages.rloo.reward_model_gpu=true"], "reward_model_gpu: true holds"),
    # lora.experts (issue 34): PEFT's ParamWrapper raises on the adapter_names batch SharedBaseScore scores with
    ([*LORA, "stages.rm.lora.experts=true", "stages.rm.lora.dropout=0"], "the rm stage sets lora.experts"),
    ([*LORA, "stages.rloo.lora.experts=true", "stages.rloo.lora.dropout=0"], "this stage sets lora.experts"),
])
def test_auto_keeps_the_merged_reward_model_otherwise_and_true_says_why_not(repo, sets, blocker):
    assert rl_config(repo, *sets).stages.get("rloo").reward_shared_base is False
    with pytest.raises(ValueError, match=f"stages.rloo.*reward_shared_base: true.* {blocker}"):
        rl_config(repo, *sets, "stages.rloo.reward_shared_base=true")


def test_the_reward_adapter_is_planned_at_the_rm_stages_rank_not_the_policys(repo):
    cfg = rl_config(repo, *LORA, "stages.rm.lora.rank=64", "stages.rloo.lora.rank=8")
    rloo = cfg.stages.get("rloo")
    assert rloo.reward_shared_base is True and rloo.reward_lora_rank == 64
    rtx4090 = make_budget(24.0, 2.0, "rtx4090", True, "t")
    shared = {**KW, "reward_shared_base": True}
    at_64 = RLOOStageConfig(**shared)
    at_64._rm_lora_rank = 64  # as the pipeline config resolves it (the assertions above)
    adapter = plan_stage("rloo", at_64, 1, True, Q7, rtx4090).prediction.breakdown_gib["reward_adapter"]
    assert adapter == pytest.approx((4 * Q7.lora_params(64) + 2 * Q7.hidden) / GIB, abs=0.001)
    # unresolved (a stage config planned on its own): the policy's rank, as before
    alone = plan_stage("rloo", RLOOStageConfig(**shared), 1, True, Q7, rtx4090).prediction.breakdown_gib
    assert alone["reward_adapter"] == pytest.approx((4 * Q7.lora_params(8) + 2 * Q7.hidden) / GIB, abs=0.001)
    assert rl_config(repo, *LORA, "stages.rloo.reward_shared_base=false").stages.get("rloo").reward_lora_rank == 0


def test_false_keeps_the_merged_reward_model_and_the_key_is_a_memory_knob(repo):
    assert rl_config(repo, *LORA, "stages.rloo.reward_shared_base=false").stages.get("rloo").reward_shared_base \
        is False
    assert "reward_shared_base" not in RLOOStageConfig(reward_shared_base=True).training_identity()
    with pytest.raises(ValueError, match="reward_shared_base: true puts the reward model's adapter beside the "
                                         "policy, and reward_model_gpu: true holds it in an actor"):
        RLOOStageConfig(reward_shared_base=True, reward_model_gpu=True)


def test_7b_lora_rloo_refused_at_24_gib_with_a_separate_reward_model_fits_with_the_shared_base():
    rtx4090 = make_budget(24.0, 2.0, "rtx4090", True, "t")
    with pytest.raises(PlanError) as err:
        plan_stage("rloo", RLOOStageConfig(**KW), 1, True, Q7, rtx4090)
    assert "smallest predicted peak: 28.9 GiB" in str(err.value)
    # The refusal names the shared base among its hints: the scoring moment at micro-batch 1 decides there.
    assert ("rm with LoRA from this stage's `from` (reward_shared_base: its adapter on the policy's base, no second "
            "network): 18.6 GiB (fits)") in str(err.value)
    plan = plan_stage("rloo", RLOOStageConfig(**KW, reward_shared_base=True), 1, True, Q7, rtx4090)
    assert plan.prediction.peak_gib <= 22.0 and plan.micro_batch * plan.grad_accum == 16
    breakdown = plan.prediction.breakdown_gib
    assert "reward_model" not in breakdown
    # The rm's rank-8 adapter in fp32 (PEFT's) and its score head: 77 MiB, not 13.17 GiB.
    assert breakdown["reward_adapter"] == pytest.approx((4 * Q7.lora_params(8) + 2 * Q7.hidden) / GIB, abs=0.001)
    assert plan.reward_model_on == ("the policy's own base (shared base): the rm stage's LoRA adapter + score head in "
                                    "the GPU of each training worker (77.0 MiB; a scoring forward of 16 x 1024 "
                                    "tokens 3.91 GiB), no second network")
    assert f"  reward model: on {plan.reward_model_on}" in format_plan(plan)


def test_the_scoring_forward_is_a_moment_of_its_own():
    """Weights + optimizer states + adapter + one no-grad forward of 16 sequences (one layer's working set, and
    PEFT's mixed-batch copies of down_proj's input: bf16, then fp32): the peak at micro-batch 1 with every layer
    checkpointed (training and generation hold less there)."""
    rtx4090 = make_budget(24.0, 2.0, "rtx4090", True, "t")
    plan = plan_stage("rloo", RLOOStageConfig(**KW, reward_shared_base=True, micro_batch=1), 1, True, Q7, rtx4090)
    assert plan.prediction.moment == "reward scoring" and plan.prediction.peak_gib == pytest.approx(18.6, abs=0.05)
    tokens = 16 * 1024
    assert plan.prediction.breakdown_gib["scoring_forward"] == pytest.approx(
        (2 * tokens * (4 * Q7.hidden + 3 * Q7.intermediate) + (2 + 4) * tokens * Q7.intermediate) / GIB, abs=0.001)
