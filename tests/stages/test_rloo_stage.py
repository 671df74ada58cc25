"""The rloo stage on the tiny model in a plain process: TRL's RLOOTrainer samples groups, scores them with the reward
model a real rm stage trained (2 steps on the toy department pairs), logs the reward model's reward per step, the KL,
lengths and generation rates, and scores held-out prompts greedily (accuracy and the reward model's mean score)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medgpt_ray.config import LoraConfig, RLOOStageConfig, StageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import build_stage, run_stage
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.stages.rewards import RewardModelScore

LORA = LoraConfig(rank=8, alpha=16, dropout=0.0)
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/stages/conftest.py


@pytest.fixture(scope="module")
def data(repo, tmp_path_factory):
    out = tmp_path_factory.mktemp("rloo-data")
    rl = repo / "data/sample/rl"
    return {"prompt": prepare_kind("prompt", [str(rl / "department_prompts.jsonl")], out, 0.1, max_records=48),
            "preference": prepare_kind("preference", [str(rl / "department_pairs.jsonl")], out, 0.1,
                                       max_records=32)}


@pytest.fixture(scope="module")
def reward_model(data, tiny_model, tmp_path_factory) -> Path:
    """A finished rm stage's merged model: 2 full-weight steps on the department pairs."""
    cfg = StageConfig(method="full", lr=1e-3, max_steps=2, seq_len=96, effective_batch=4, logging_steps=1,
                      save_steps=100, warmup_ratio=0.0)
    d = data["preference"]
    out = tmp_path_factory.mktemp("rm")
    r = run_stage(StageInputs("rm", cfg, plan_stage("rm", cfg, 1, False), str(tiny_model), "chatml", d.train_file,
                              d.eval_file, str(out)))
    return Path(r["output_model"])


def rloo_inputs(data, model: Path, reward_model: Path, out: Path, **keys) -> StageInputs:
    kw = dict(method="lora", lora=LORA, lr=5e-3, max_steps=2, seq_len=96, effective_batch=8, num_generations=4,
              max_completion_length=6, logging_steps=1, save_steps=100, warmup_ratio=0.0, beta=0.05)
    cfg = RLOOStageConfig(**{**kw, **keys})
    out.mkdir(parents=True, exist_ok=True)
    d = data["prompt"]
    return StageInputs("rloo", cfg, plan_stage("rloo", cfg, 1, False), str(model), "chatml", d.train_file,
                       d.eval_file, str(out), needs={"rm": str(reward_model)})


def test_rloo_trains_two_steps_on_the_reward_model(data, tiny_model, reward_model, tmp_path):
    r = run_stage(rloo_inputs(data, tiny_model, reward_model, tmp_path))
    assert r["steps"] == 2 and r["train_prompts"] > 0 and r["reward_model_scored_by"] == "worker"
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in logged if "rewards/reward_model/mean" in s]
    assert [s["step"] for s in steps] == [1, 2], logged  # the reward model's reward, every step
    for key in ("rewards/reward_model/std", "kl", "completions/mean_length", "generation/generations_per_s",
                "generation/tokens_per_s"):
        assert all(key in s for s in steps), key
    assert steps[-1]["generation/generations_per_s"] > 0 and steps[-1]["completions/mean_length"] > 0
    ev = r["eval"]
    assert ev["eval_prompts"] > 0 and 0.0 <= ev["eval_accuracy"] <= 1.0 and ev["eval_accuracy_before"] is not None
    # The held-out greedy completions scored by the reward model, before and after: real scores, not placeholders.
    assert isinstance(ev["eval_reward_model"], float) and isinstance(ev["eval_reward_model_before"], float)
    assert (tmp_path / "adapter" / "adapter_config.json").is_file() and Path(r["output_model"]).is_dir()


def test_the_trainer_gets_the_stage_keys(data, tiny_model, reward_model, tmp_path):
    built = build_stage(rloo_inputs(data, tiny_model, reward_model, tmp_path, temperature=0.7, beta=0.1,
                                    normalize_advantages=True, reward_funcs=["reward_model", "length"],
                                    reward_weights=[1.0, 0.5], max_completion_length=12,
                                    reward_clip_range=[-3.0, 4.0]))
    from trl import RLOOTrainer

    t = built.trainer
    assert isinstance(t, RLOOTrainer)
    assert (t.num_generations, t.max_completion_length, t.temperature, t.beta) == (4, 12, 0.7, 0.1)
    assert t.normalize_advantages is True and t.reward_weights.tolist() == [1.0, 0.5]
    assert t.reward_clip_range == (-3.0, 4.0)  # TRL's: the weighted sum clipped, so the functions are not wrapped
    assert t.reward_func_names == ["reward_model", "length"] and t.ref_model is None  # LoRA: the adapter-off policy
    scorer = t.reward_funcs[0]
    assert isinstance(scorer, RewardModelScore) and scorer.model_dir == str(reward_model) and scorer.device == "cpu"


def test_rloo_without_a_finished_rm_is_refused(data, tiny_model, reward_model, tmp_path):
    inp = rloo_inputs(data, tiny_model, reward_model, tmp_path)
    inp.needs = {}
    with pytest.raises(ValueError, match="stages.rloo.needs: rloo is rewarded by the rm stage's model"):
        build_stage(inp)
