"""The grpo stage on the tiny model in a plain process: TRL's GRPOTrainer samples groups, scores them with the named
reward functions, logs the rewards, KL, lengths and generation rates, and scores held-out prompts greedily."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medgpt_ray.config import GRPOStageConfig, LoraConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import build_stage, run_stage
from medgpt_ray.stages.inputs import StageInputs


@pytest.fixture(scope="module")
def prompts(repo, tmp_path_factory):
    files = [str(repo / "data/sample/rl/department_prompts.jsonl"), str(repo / "data/sample/formats/grpo_qa.jsonl")]
    return prepare_kind("prompt", files, tmp_path_factory.mktemp("prompts"), 0.1, max_records=64)


def grpo_inputs(prompts, model: Path, out: Path, **keys) -> StageInputs:
    kw = dict(method="lora", lora=LoraConfig(rank=8, alpha=16, dropout=0.0), lr=5e-3, max_steps=2, seq_len=160,
              effective_batch=8, num_generations=4, max_completion_length=8, logging_steps=1, save_steps=100,
              warmup_ratio=0.0, beta=0.04, reward_funcs=["accuracy", "format", "length"])
    cfg = GRPOStageConfig(**{**kw, **keys})
    out.mkdir(parents=True, exist_ok=True)
    return StageInputs("grpo", cfg, plan_stage("grpo", cfg, 1, False), str(model), "chatml", prompts.train_file,
                       prompts.eval_file, str(out))


def test_grpo_trains_two_steps_and_logs_its_rewards(prompts, tiny_model, tmp_path):
    r = run_stage(grpo_inputs(prompts, tiny_model, tmp_path))
    assert r["steps"] == 2 and r["train_prompts"] > 0
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in logged if "rewards/accuracy/mean" in s]
    assert steps, logged
    for key in ("rewards/accuracy/mean", "rewards/accuracy/std", "rewards/format/mean", "rewards/length/mean",
                "kl", "completions/mean_length", "generation/generations_per_s", "generation/tokens_per_s"):
        assert key in steps[-1], key
    assert steps[-1]["generation/generations_per_s"] > 0
    ev = r["eval"]
    assert ev["eval_prompts"] > 0 and 0.0 <= ev["eval_accuracy"] <= 1.0 and ev["eval_accuracy_before"] is not None
    assert (tmp_path / "adapter" / "adapter_config.json").is_file() and Path(r["output_model"]).is_dir()


def test_the_trainer_gets_the_stage_keys(prompts, tiny_model, tmp_path):
    built = build_stage(grpo_inputs(prompts, tiny_model, tmp_path, temperature=0.7, beta=0.1, loss_type="grpo",
                                    scale_rewards="none", reward_funcs=["accuracy", "length"],
                                    reward_weights=[1.0, 0.5], max_completion_length=12,
                                    reward_clip_range=[-0.25, 0.5]))
    t = built.trainer
    assert (t.num_generations, t.max_completion_length, t.temperature, t.beta, t.loss_type) == (4, 12, 0.7, 0.1,
                                                                                             "grpo")
    assert t.scale_rewards == "none" and t.reward_weights.tolist() == [1.0, 0.5]
    assert t.reward_func_names == ["accuracy", "length"] and t.ref_model is None  # LoRA: the adapter-off policy
    # reward_clip_range: TRL's GRPOTrainer has none, each reward function's values are clipped in our wrapper.
    assert t.reward_funcs[0](completions=["<answer>心内科</answer>", "x"], answer=["心内科", "心内科"]) == [0.5, 0.0]
    assert t.reward_funcs[1](completions=["a", "b"], completion_ids=[[1], [1] * 12]) == [0.0, -0.25]


def test_a_plan_that_samples_a_step_in_two_generate_calls_trains_so(prompts, tiny_model, tmp_path):
    # The planner splits a step's sampling when one call's KV cache would not fit (memory/generation.py
    # generation_choices): micro-batch 4 x accumulation 2, one micro-batch (one group of 4) per generate call.
    from dataclasses import replace

    inp = grpo_inputs(prompts, tiny_model, tmp_path, micro_batch=4)
    inp = replace(inp, plan=replace(inp.plan, steps_per_generation=1))
    assert (inp.plan.micro_batch, inp.plan.grad_accum) == (4, 2)
    built = build_stage(inp)
    assert built.trainer.args.steps_per_generation == 1
    calls = []
    generate = built.trainer._generate
    built.trainer._generate = lambda batch: calls.append(len(batch)) or generate(batch)
    built.trainer.train()
    assert calls == [4, 4, 4, 4]  # 2 steps x 2 calls of 4 completions (one prompt's group each)


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="effective_batch: 6 completions per step is not a multiple of "
                                         "num_generations 4"):
        GRPOStageConfig(effective_batch=6, num_generations=4)
    with pytest.raises(ValueError, match="reward_weights: 1 weights for 2"):
        GRPOStageConfig(reward_funcs=["accuracy", "format"], reward_weights=[1.0])
    with pytest.raises(ValueError, match="'accuracyy' is not one of"):
        GRPOStageConfig(reward_funcs=["accuracyy"])
    with pytest.raises(ValueError, match="max_completion_length: 512 leaves no room"):
        GRPOStageConfig(seq_len=512, max_completion_length=512)
    assert GRPOStageConfig(reward_funcs=["reward_model"]).needs == ["rm"]


def test_rl_metrics_are_exported_like_the_training_metrics(monkeypatch):
    """TRL's GRPO logs (rewards per function, KL, lengths) and our generation rates become the medgpt_rl_* gauges,
    with the reward function as a tag."""
    from types import SimpleNamespace

    from medgpt_ray.metrics import BY_NAME
    from medgpt_ray.stages import telemetry

    got: dict[tuple[str, str], float] = {}

    class Recorder:
        def set(self, name, value, tags):
            assert set(BY_NAME[name].tags) <= set(tags)
            got[(name, tags.get("reward", ""))] = value

    monkeypatch.setattr(telemetry, "metrics", lambda: Recorder())
    cb = telemetry.StageMetrics("run", "grpo", SimpleNamespace(prediction=None), None, None)
    logs = {"loss": 0.1, "rewards/accuracy/mean": 0.4, "rewards/accuracy/std": 0.3, "rewards/format/mean": 1.0,
            "kl": 0.02, "completions/mean_length": 5.5, "generation/generations_per_s": 120.0,
            "generation/tokens_per_s": 600.0}
    cb.on_log(None, SimpleNamespace(global_step=3), None, logs=logs)
    assert got[("medgpt_rl_reward_mean", "accuracy")] == 0.4 and got[("medgpt_rl_reward_std", "accuracy")] == 0.3
    assert got[("medgpt_rl_reward_mean", "format")] == 1.0 and got[("medgpt_rl_kl", "")] == 0.02
    assert got[("medgpt_rl_completion_length", "")] == 5.5
    assert got[("medgpt_rl_generations_per_second", "")] == 120.0
    assert got[("medgpt_rl_generation_tokens_per_second", "")] == 600.0
