"""GRPO's reward functions (stages/rewards.py) and the answer matching behind `accuracy` (stages/answer_match.py)."""

from __future__ import annotations

import pytest

from medgpt_ray.stages.answer_match import answers_match, extract_answer, normalize, parse_number
from medgpt_ray.stages.rewards import (
    accuracy,
    format_reward,
    import_reward,
    length_penalty,
    reward_functions,
)


@pytest.mark.parametrize("text, expected", [
    ("心内科。", "心内科"), ("  心 内 科 ", "心内科"), ("《心内科》！", "心内科"), ("Ｂ．", "b"),
    ("“呼吸科”，", "呼吸科"), ("ＡＢＣ", "abc"), ("（B）", "b"), ("１２３", "123"),
])
def test_normalize_strips_chinese_and_full_width_punctuation(text, expected):
    assert normalize(text) == expected


@pytest.mark.parametrize("text, value", [
    ("45", 45.0), ("1,200", 1200.0), ("３．５", 3.5), ("45%", 0.45), ("４５％", 0.45), ("四十五", 45.0),
    ("十二", 12.0), ("两千零五", 2005.0), ("三万五千", 35000.0), ("三点五", 3.5), ("百分之三十", 0.3),
    ("12岁", 12.0), ("1e3", 1000.0), ("心内科", None), ("B", None), ("", None),
])
def test_parse_number(text, value):
    assert parse_number(text) == (pytest.approx(value) if value is not None else None)


@pytest.mark.parametrize("predicted, reference, match", [
    ("心内科", "心内科", True), ("心内科。", "心内科", True), ("呼吸科", "心内科", False),
    ("b", "B", True), ("Ｂ", "B", True), ("B. 依那普利", "B", False),
    ("45", "四十五", True), ("45.0", "45", True), ("1,200", "1200", True), ("0.45", "45%", True),
    ("45", "45%", True), ("百分之四十五", "45%", True), ("46", "45", False), ("3.5", "三点五", True),
    ("", "", False),
])
def test_answers_match(predicted, reference, match):
    assert answers_match(predicted, reference) is match


def test_extract_answer_takes_the_last_answer_tag_else_drops_the_thinking():
    assert extract_answer("<think>想一想</think><answer>心内科</answer>") == "心内科"
    assert extract_answer("<answer>A</answer> 不对 <answer>B</answer>") == "B"
    assert extract_answer("<think>是呼吸科吗</think>心内科") == "心内科"
    assert extract_answer("心内科") == "心内科"


def test_accuracy_reward_per_completion_and_none_without_a_reference():
    completions = ["<think>胸痛</think><answer>心内科。</answer>", "<answer>呼吸科</answer>", "四十五", "x"]
    assert accuracy(completions, answer=["心内科", "心内科", "45", None]) == [1.0, 0.0, 1.0, None]
    # conversational completions: [assistant message]
    assert accuracy([[{"role": "assistant", "content": "<answer>B</answer>"}]], answer=["b"]) == [1.0]


def test_format_reward_wants_think_then_answer_and_nothing_else():
    good = "<think>患者胸痛，考虑心脏疾病。</think>\n<answer>心内科</answer>"
    wrong = ["<answer>心内科</answer>", "心内科", good + "多余", "<answer>x</answer><think>y</think>"]
    assert format_reward([good, *wrong]) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert format_reward.__name__ == "format"


def test_length_penalty_is_soft_beyond_the_target():
    length = length_penalty(target=10, limit=30)
    got = length(["a"] * 4, completion_ids=[[0] * 5, [0] * 10, [0] * 20, [0] * 40])
    assert got == [0.0, 0.0, -0.5, -1.0]
    assert length.__name__ == "length"


def test_custom_rewards_by_import_path_and_clear_errors():
    assert import_reward("medgpt_ray.stages.rewards:accuracy") is accuracy
    assert import_reward("medgpt_ray.stages.rewards.accuracy") is accuracy
    with pytest.raises(ValueError, match="cannot import"):
        import_reward("medgpt_ray.stages.rewards:nope")
    with pytest.raises(ValueError, match="import path"):
        import_reward("nonsense")
    with pytest.raises(ValueError, match="needs the output of a finished rm stage"):
        reward_functions(["reward_model"], length_target=8, max_completion_length=16, stage="grpo")
    funcs = reward_functions(["accuracy", "format", "length", "medgpt_ray.stages.rewards:accuracy"],
                             length_target=8, max_completion_length=16, stage="grpo")
    assert [f.__name__ for f in funcs] == ["accuracy", "format", "length", "accuracy"]


def test_reward_model_scores_prompt_and_completion(tiny_model, tmp_path):
    """A sequence-classification model saved like the rm stage's output scores each completion (finite, per item,
    different completions score differently)."""
    import math

    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_pretrained(str(tiny_model), num_labels=1, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(tiny_model), local_files_only=True)
    rm.config.pad_token_id = tok.pad_token_id
    rm.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    (score,) = reward_functions(["reward_model"], length_target=8, max_completion_length=16,
                                reward_model_dir=str(tmp_path), stage="grpo")
    got = score(prompts=["患者胸痛，去哪个科室？"] * 3, completions=["心内科", "呼吸科", "心内科"])
    assert len(got) == 3 and all(math.isfinite(x) for x in got)
    assert got[0] == pytest.approx(got[2]) and got[0] != got[1]
    assert score.__name__ == "reward_model"
