"""stages.<grpo|rloo>.reward_clip_range (issue 36 item 8): validated in a sentence naming the key, shown in plan.json
with where it applies, and grpo's clipping wrapper (TRL's GRPOTrainer has no reward_clip_range)."""

from __future__ import annotations

import pytest

from medgpt_ray.config import GRPOStageConfig, RLOOStageConfig
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages.rewards import clipped, reward_functions


@pytest.mark.parametrize("bad", [[5.0, -5.0], [1.0, 1.0], [0.0, float("inf")], [1.0], [1.0, 2.0, 3.0]])
def test_a_bad_range_is_refused_naming_the_key(bad):
    with pytest.raises(ValueError, match="reward_clip_range"):
        GRPOStageConfig(reward_clip_range=bad)


def test_the_range_and_where_it_applies_are_in_the_plan():
    grpo = plan_stage("grpo", GRPOStageConfig(reward_clip_range=[-5, 5]), 1, False).to_dict()["reward_clip"]
    rloo = plan_stage("rloo", RLOOStageConfig(reward_clip_range=[-2, 3]), 1, False).to_dict()["reward_clip"]
    assert grpo["min"] == -5 and grpo["max"] == 5 and "each reward function" in grpo["applied_to"]
    assert (rloo["min"], rloo["max"]) == (-2, 3) and "TRL's reward_clip_range" in rloo["applied_to"]
    assert plan_stage("grpo", GRPOStageConfig(), 1, False).to_dict()["reward_clip"] is None  # off by default
    assert GRPOStageConfig(reward_clip_range=[-1, 1]).training_identity()["reward_clip_range"] == [-1, 1]


def test_the_wrapper_clips_values_keeps_none_and_the_name():
    def big(completions, **kwargs):
        return [1e6, -1e6, None, 0.25]

    f = clipped(big, -1.0, 2.0)
    assert f(completions=[""] * 4) == [2.0, -1.0, None, 0.25] and f.__name__ == "big" and f.__wrapped__ is big
    funcs = reward_functions(["format", "length"], length_target=1, max_completion_length=3, stage="grpo",
                             clip=[-0.5, 0.5])
    assert [f.__name__ for f in funcs] == ["format", "length"]
    assert funcs[0](completions=["<think>a</think><answer>b</answer>"]) == [0.5]
    assert funcs[1](completions=["x"], completion_ids=[[1, 2, 3]]) == [-0.5]


def test_the_memory_command_and_the_plan_line_print_the_clipping():
    from medgpt_ray.memory.format import format_plan, plan_line

    plan = plan_stage("rloo", RLOOStageConfig(reward_clip_range=[-2, 3.5]), 1, False)
    assert plan_line(plan).endswith("; rewards clipped to [-2, 3.5]")
    lines = format_plan(plan)
    assert "  rewards clipped to [-2, 3.5]: the weighted sum of the rewards, before the KL penalty (TRL's " \
           "reward_clip_range)" in lines
