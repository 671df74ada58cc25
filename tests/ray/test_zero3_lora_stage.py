"""A LoRA stage under DeepSpeed ZeRO-3 on two Ray Train workers (CPU), end to end: rloo with the rm's merged
network as its reward. Two hangs/crashes are guarded here. The merge of the adapter on rank 0 at the end of every
multi-worker ZeRO-3 LoRA stage waited forever: transformers built the base under deepspeed.zero.Init, whose
broadcasts the other rank never joined. The reward network, loaded on each worker at its first score, was
partitioned by the same zero.Init with no engine to gather it (DeepSpeed's batch-size assertion, on CPU)."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest
from safetensors.torch import load_file

from medgpt_ray.config import LoraConfig, RLOOStageConfig
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.run.progress import ProgressActor
from medgpt_ray.run.stage_runner import RayOptions, run_stage_on_ray
from medgpt_ray.stages.inputs import StageInputs
from tests.stages.test_rloo_stage import data, reward_model  # noqa: F401  (department prompts; a full rm)

pytestmark = pytest.mark.ray


def run_or_fail_after(seconds: int, fn: Callable[[], Any]) -> Any:
    """fn() (a Ray Train fit), or a failed test when it does not return within `seconds`: a ZeRO-3 collective
    waiting on one rank hangs forever, and a signal does not reach a driver blocked in ray.get. The run's Ray Train
    worker processes (on this test's shared cluster, found by the State API) are killed so the fit returns and the
    cluster's 2 CPUs are free for the tests after this one."""
    from ray.util.state import list_actors

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as err:  # handed to the test's thread below
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for actor in list_actors(filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")]):
            os.kill(actor.pid, signal.SIGKILL)
        thread.join(120)
        pytest.fail(f"the stage did not finish within {seconds} s: a ZeRO-3 collective waiting on one rank?")
    if "error" in box:
        raise box["error"]
    return box["result"]


def test_rloo_lora_under_zero3_on_two_workers_scores_merges_and_finishes(ray_cluster, data, reward_model,  # noqa: F811
                                                                          tiny_model, tmp_path):
    cfg = RLOOStageConfig(method="lora", lora=LoraConfig(rank=8, alpha=16), lr=5e-3, max_steps=2, seq_len=96,
                          effective_batch=16, num_generations=4, max_completion_length=6, logging_steps=1,
                          save_steps=100, warmup_ratio=0.0, beta=0.05, zero_stage=3)
    plan = plan_stage("rloo", cfg, 2, False)
    assert plan.deepspeed["zero_optimization"]["stage"] == 3
    out = tmp_path / "rloo"
    out.mkdir()
    p = data["prompt"]
    inputs = StageInputs("rloo", cfg, plan, str(tiny_model), "chatml", p.train_file, p.eval_file, str(out),
                         needs={"rm": str(reward_model)})
    namespace = ray_cluster.get_runtime_context().namespace
    actor = ProgressActor.options(name="zero3-progress", namespace=namespace).remote()  # noqa: F841 (kept alive)
    opts = RayOptions(str(tmp_path / "_ray"), "zero3", progress=("zero3-progress", namespace))
    run_or_fail_after(420, lambda: run_stage_on_ray(inputs, opts))
    receipt = json.loads((out / "result.json").read_text())
    assert (receipt["world_size"], receipt["deepspeed"], receipt["steps"]) == (2, True, 2)
    assert receipt["reward_model_scored_by"] == "worker"
    assert isinstance(receipt["eval"]["eval_reward_model"], float)  # the held-out greedy answers, scored
    # The merged model is the base plus the trained adapter: some adapted weight moved.
    base, merged = load_file(str(tiny_model / "model.safetensors")), load_file(str(out / "model" / "model.safetensors"))
    adapted = [k for k in base if k.endswith("q_proj.weight") and k in merged]
    assert adapted and any(not base[k].equal(merged[k].to(base[k].dtype)) for k in adapted)
