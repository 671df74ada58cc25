"""One stage inside a Ray Train TorchTrainer with 2 CPU workers on the shared local cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medgpt_ray.config import LoraConfig, StageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.run.progress import ProgressActor
from medgpt_ray.run.stage_runner import RayOptions, run_stage_on_ray
from medgpt_ray.stages.inputs import StageInputs

pytestmark = pytest.mark.ray


def test_sft_with_deepspeed_zero2_on_two_workers_each_on_its_shard_matches_its_own_report(ray_cluster, repo,
                                                                                        tiny_model, tmp_path):
    """One Ray Train run checks the runner's wiring (2 workers, progress actor, a Tune trial's extra metrics, the
    result checkpoint), the GPU path's DeepSpeed wiring on CPU (the planner's ZeRO-2 dict accepted by HF/TRL as
    is, with accumulation) and the data shards: one epoch over 23 records, worker k reads rows
    [k*23//2, (k+1)*23//2) and trains on exactly those (11 and 12, the shorter shard padded by one), so the epoch
    is 12 micro-batches per worker = 6 steps; had accelerate split each shard again it would be 3."""
    # ~40-60 s on 2 cores, up to ~85 s when the box is shared: two Ray Train workers each import DeepSpeed and
    # start its CPU comm op (built once into the cache, FIELD-NOTES); one run instead of the three it replaced.
    ray = ray_cluster
    data = prepare_kind("sft", [str(repo / "data/sample/sft_sharegpt.jsonl")], tmp_path / "data", 0.1,
                        max_records=23)
    assert data.train_records == 23
    cfg = StageConfig(method="lora", lora=LoraConfig(rank=8, alpha=16, dropout=0.0), lr=5e-3, epochs=1,
                      seq_len=512, effective_batch=4, micro_batch=1, logging_steps=1, save_steps=100,
                      zero_stage=2, warmup_ratio=0.0)
    plan = plan_stage("sft", cfg, 2, False)
    assert plan.deepspeed["zero_optimization"]["stage"] == 2
    assert (plan.micro_batch, plan.grad_accum) == (1, 2)  # effective batch 4 = 1 x accum 2 x 2 workers
    out = tmp_path / "sft"
    out.mkdir()
    inputs = StageInputs("sft", cfg, plan, str(tiny_model), "chatml", data.train_file, data.eval_file, str(out))
    namespace = ray.get_runtime_context().namespace
    actor = ProgressActor.options(name="test-progress", namespace=namespace).remote()

    opts = RayOptions(str(tmp_path / "_ray"), "test-sft", progress=("test-progress", namespace),
                      extra_metrics={"trial": "x"})
    result = run_stage_on_ray(inputs, opts)

    receipt = json.loads((out / "result.json").read_text())
    assert receipt["world_size"] == 2 and receipt["deepspeed"] is True
    assert receipt["train_loss_last"] < receipt["train_loss_first"]
    got = [w["shard"] for w in receipt["workers"]]
    assert [(s["rank"], s["shards"], s["rows"], s["split_rows"]) for s in got] == [
        (0, 2, [0, 11], 23), (1, 2, [11, 23], 23)]
    assert [s["examples"] for s in got] == [11, 12]  # every record fits seq_len: the shard's rows, no more
    assert [s["epoch_examples"] for s in got] == [12, 12] and [s["trained_examples"] for s in got] == [12, 12]
    assert result.metrics["steps"] == receipt["steps"] == 6
    assert result.metrics["train_loss_last"] == pytest.approx(receipt["train_loss_last"])
    assert result.metrics["eval_loss"] == pytest.approx(receipt["eval"]["eval_loss"])
    assert result.metrics["completed"] == 1 and result.metrics["trial"] == "x"  # what a Tune trial adds
    with result.checkpoint.as_directory() as d:
        assert json.loads((Path(d) / "result.json").read_text())["steps"] == 6
    progress = ray.get(actor.drain.remote())
    assert [r["step"] for r in progress if "loss" in r] == [1, 2, 3, 4, 5, 6]
    ray.kill(actor)


def test_the_progress_poll_hands_a_workers_plan_to_its_stage_and_prints_the_rest(ray_cluster):
    """run/wave.py's poll on a real progress actor: a worker's plan record reaches its stage's job (which writes
    plan.json), never the printer; step records still print."""
    from medgpt_ray.config import PipelineConfig
    from medgpt_ray.run.progress import ProgressPrinter
    from medgpt_ray.run.wave import progress_channel
    from medgpt_ray.stages.packing import worker_plan_record

    cfg = PipelineConfig.model_validate({"model": {"path": "tiny"}, "output_dir": "/tmp/x", "name": "poll-test",
                                         "stages": {"sft": {"method": "lora", "max_steps": 2, "seq_len": 64}}})
    lines: list[str] = []
    plan = plan_stage("sft", cfg.stages.get("sft"), 1, False)
    with progress_channel(cfg, lines.append) as progress:
        assert isinstance(progress.printer, ProgressPrinter)
        handed: list[dict] = []
        progress.plans["sft"] = handed.append
        import ray

        ray.get([progress.actor.push.remote(worker_plan_record("sft", plan)),
                 progress.actor.push.remote({"stage": "sft", "step": 1, "total_steps": 2, "loss": 1.5,
                                                   "time_s": 3.0})])
        progress.poll()
    assert [h["micro_batch"] for h in handed] == [plan.micro_batch]
    assert len(lines) == 1 and "loss 1.5000" in lines[0] and "worker_plan" not in lines[0]
