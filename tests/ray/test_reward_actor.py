"""The reward model in a Ray actor of its own (`reward_model_gpu: true`, run/reward_actor.py): it holds the GPU the
placement gave it (that GPU's token, CUDA_VISIBLE_DEVICES naming it; on the shared cluster's logical GPUs), scores as
the rm stage's model scores in the worker, is what an rloo stage's reward_model reward calls, and is gone when the
stage ends."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from medgpt_ray.run.reward_actor import reward_model_actor
from medgpt_ray.stages import run_stage
from medgpt_ray.stages.rewards import RewardModelScore
from tests.stages.test_rloo_stage import data, reward_model, rloo_inputs  # noqa: F401  (fixtures)

PROMPTS = ["<|im_start|>user\n胸痛三天，心电图ST段抬高，挂哪个科？<|im_end|>\n<|im_start|>assistant\n"] * 3
COMPLETIONS = ["心内科", "神经科", "消化科"]


def placed(inputs, gpu: int):
    """The inputs of a GPU stage whose placement gave its reward model GPU `gpu`."""
    return replace(inputs, cfg=inputs.cfg.model_copy(update={"reward_model_gpu": True}),
                   plan=replace(inputs.plan, use_gpu=True, reward_model_gpu=gpu))


def test_the_actor_holds_its_gpu_scores_like_the_worker_would_and_ends_with_the_stage(
        ray_cluster, data, tiny_model, reward_model, tmp_path):  # noqa: F811
    import ray

    inputs = placed(rloo_inputs(data, tiny_model, reward_model, tmp_path), gpu=5)
    with reward_model_actor(inputs, {}) as sent:
        client = sent.reward_scorer
        assert client.__name__ == "reward_model" and sent.plan == inputs.plan
        where = ray.get(client.actor.where.remote())
        assert where["resources"].get("medgpt_gpu_5") == 1 and where["resources"].get("GPU") == 1
        assert where["cuda_visible_devices"] == "5"  # ours, not Ray's pick (NOSET)
        scores = client(PROMPTS, COMPLETIONS)
        local = RewardModelScore(str(reward_model))(PROMPTS, COMPLETIONS)
        assert scores == pytest.approx(local, abs=1e-4) and len(set(scores)) == 3
    assert actor_dies_within(client.actor, 60)


def actor_dies_within(actor, seconds: float) -> bool:
    """True once a call to `actor` fails with RayActorError: ray.kill is asynchronous, so a call made right after it
    may still be answered; the actor must be gone within `seconds`."""
    import ray

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(actor.where.remote(), timeout=seconds)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.5)
    return False


def test_an_rloo_stage_is_rewarded_by_the_actor(ray_cluster, data, tiny_model, reward_model, tmp_path):  # noqa: F811
    # In this process, not under Ray Train (which adds ~25 s here): the workers' side is the same run_stage, and
    # run/stage_runner.run_stage_on_ray wraps its fit in the same reward_model_actor (checked by a Ray Train run
    # of this test when it was written: the actor started, scored and was DEAD after the stage).
    import ray

    inputs = rloo_inputs(data, tiny_model, reward_model, tmp_path)
    inputs = replace(inputs, cfg=inputs.cfg.model_copy(update={"reward_model_gpu": True}))  # a CPU run: no GPU
    with reward_model_actor(inputs, {}) as sent:
        result = run_stage(sent)
        where = ray.get(sent.reward_scorer.actor.where.remote())
    assert where["calls"] >= 4 and "GPU" not in where["resources"]  # 2 steps, held-out before and after
    assert result["steps"] == 2 and result["reward_model_scored_by"] == "actor"  # the stage loaded no rm
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["step"] for r in rows if "rewards/reward_model/mean" in r] == [1, 2]
    assert isinstance(result["eval"]["eval_reward_model"], float)
