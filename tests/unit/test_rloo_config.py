"""stages.rloo's keys: errors that name the key, rm always needed, the keys in the stage's fingerprint; and the toy
department pairs the rm stage of configs/tiny-cpu-rl.yaml trains on."""

from __future__ import annotations

import importlib.util
import json

import pytest

from medgpt_ray.config import GRPOStageConfig, RLOOStageConfig, load_config


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match=r"reward_funcs: \['accuracy'\] has no reward_model: rloo is rewarded by "
                                         r"the rm stage's model"):
        RLOOStageConfig(reward_funcs=["accuracy"])
    with pytest.raises(ValueError, match="num_generations"):
        RLOOStageConfig(num_generations=1)
    with pytest.raises(ValueError, match="effective_batch: 12 completions per step is not a multiple of "
                                         "num_generations 8"):
        RLOOStageConfig(effective_batch=12)
    with pytest.raises(ValueError, match="reward_weights: 1 weights for 2 reward function"):
        RLOOStageConfig(reward_funcs=["reward_model", "length"], reward_weights=[1.0])
    with pytest.raises(ValueError, match="'lenght' is not one of"):
        RLOOStageConfig(reward_funcs=["reward_model", "lenght"])
    with pytest.raises(ValueError, match="max_completion_length: 96 leaves no room for the prompt in seq_len 96"):
        RLOOStageConfig(seq_len=96, max_completion_length=96)
    with pytest.raises(ValueError, match="beta"):
        RLOOStageConfig(beta=-0.1)


def test_rloo_always_needs_rm_and_keeps_what_else_it_needs():
    assert RLOOStageConfig().needs == ["rm"] and RLOOStageConfig().reward_funcs == ["reward_model"]
    assert RLOOStageConfig(needs=["dpo"], reward_funcs=["reward_model", "length"]).needs == ["dpo", "rm"]
    assert RLOOStageConfig(needs=["rm"]).needs == ["rm"]
    assert RLOOStageConfig().beta == 0.05 and GRPOStageConfig().beta == 0.0  # each kind its trainer's default
    assert GRPOStageConfig().needs == []  # grpo's default rewards are rules: no rm


@pytest.mark.parametrize("key, value", [("normalize_advantages", True), ("beta", 0.1), ("num_generations", 4),
                                        ("max_completion_length", 64), ("temperature", 0.7),
                                        ("reward_funcs", ["reward_model", "length"]), ("reward_weights", [2.0])])
def test_every_rloo_key_is_in_the_stage_fingerprint(key, value):
    assert RLOOStageConfig(**{key: value}).training_identity() != RLOOStageConfig().training_identity()
    assert RLOOStageConfig(**{key: value}).training_identity()[key] == value


def test_the_rl_config_runs_sft_grpo_and_sft_rm_rloo(repo):
    cfg = load_config(repo / "configs/tiny-cpu-rl.yaml")
    assert cfg.enabled_stages() == ["sft", "rm", "grpo", "rloo"]
    assert cfg.depends_on("rloo") == ["sft", "rm"] and cfg.depends_on("rm") == ["sft"]
    assert cfg.data.preference == ["data/sample/rl/department_pairs.jsonl"]


def test_the_department_pairs_are_what_make_rl_writes(repo):
    spec = importlib.util.spec_from_file_location("make_rl", repo / "data/sample/rl/make_rl.py")
    make_rl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_rl)
    pairs = make_rl.department_pairs()
    assert pairs == make_rl.department_pairs()  # deterministic
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in pairs)
    assert (repo / "data/sample/rl/department_pairs.jsonl").read_text(encoding="utf-8") == text  # regenerated
    right = {dx: dept for dept, dxs in make_rl.RL_DIAGNOSES.items() for dx in dxs}
    kinds = {"of the four": 0, "another department": 0, "misspelt": 0}
    for r in pairs:
        question = r["conversations"][0]["value"]
        dept = next(d for dx, d in right.items() if dx in question)
        assert r["chosen"] == dept and r["rejected"] != dept
        if r["rejected"] in make_rl.DEPARTMENTS:
            kinds["of the four"] += 1
        elif r["rejected"] in make_rl.OTHER_DEPARTMENTS:
            kinds["another department"] += 1
        else:  # the right department in a wrong form
            assert r["rejected"] in {dept[:-1], dept + "科", dept[:-1] + dept}
            kinds["misspelt"] += 1
    assert kinds == {"of the four": 240, "another department": 120, "misspelt": 120}
