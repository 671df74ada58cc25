"""A stage interrupted after a checkpoint and resumed trains exactly the batches an uninterrupted run trains: the
shard's batch order depends only on (seed, epoch), so HF's "skip the batches already trained" skips those. The
interruption lands in the second epoch, where the resumed loader must also take up the right epoch's order. Packed
(stages/packing.py), the examples are the packed rows: 12 conversations make 10 rows, 3 a step (about the 4
conversations of the effective batch, 1 row a micro-batch), so an epoch is 4 steps and checkpoint-5 is one step into
the second: the resumed loader skips that step's 3 micro-batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from medgpt_ray.config import LoraConfig, SFTStageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import build_stage
from medgpt_ray.stages.callbacks import INJECT_OOM_ENV
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.stages.outputs import train
from medgpt_ray.trainer_kit.shard_sampler import ShardBatchSampler


def per_step(out: Path) -> dict[int, tuple[float, float]]:
    """(loss, grad_norm) of every logged step; each step is logged once, also after a resume (the resumed attempt
    drops what the interrupted one logged after its checkpoint)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert len(steps) == len(set(steps)), f"a step logged twice: {steps}"
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in rows if "loss" in r}


@pytest.mark.parametrize("packing,save_steps,total", [(False, 4, 6), (True, 5, 8)])
def test_resumed_run_trains_the_batches_the_uninterrupted_run_trains(packing, save_steps, total, repo, tiny_model,
                                                                      tmp_path, monkeypatch):
    data = prepare_kind("sft", [str(repo / "data/sample/sft_sharegpt.jsonl")], tmp_path / "data", 0.1,
                        max_records=12)
    cfg = SFTStageConfig(method="lora", lora=LoraConfig(rank=8, alpha=16, dropout=0.0), lr=5e-3, epochs=2,
                         seq_len=512, effective_batch=4, micro_batch=2, logging_steps=1, save_steps=save_steps,
                         warmup_ratio=0.0, packing=packing)
    plan = plan_stage("sft", cfg, 1, False)
    epochs: list[int] = []  # the epoch each pass over the shard was ordered for
    order = ShardBatchSampler.__iter__

    def spy(self):
        epochs.append(self.epoch)
        return order(self)

    monkeypatch.setattr(ShardBatchSampler, "__iter__", spy)

    def run(out: Path):
        """Build and train as run_stage does (resuming from the newest checkpoint), without the final
        evaluation and merge: (global steps, the checkpoint it resumed from)."""
        out.mkdir(exist_ok=True)
        inp = StageInputs("sft", cfg, plan, str(tiny_model), "chatml", data.train_file, data.eval_file, str(out))
        built = build_stage(inp)
        if packing:
            assert (built.extras["packing"]["rows"], built.extras["packing"]["rows_per_step"]) == (10, 3)
        resumed_from = train(built.trainer, inp)[1]
        return built.trainer.state.global_step, resumed_from

    # Unpacked: 12 records, 4 per step: 3 steps an epoch. Packed: 10 rows, 3 per step: 4 steps an epoch.
    assert run(tmp_path / "whole") == (total, None)
    assert epochs == [0, 1]
    # After the checkpoint one step into epoch 2 and the log of the step after it, which the resumed attempt
    # trains again.
    monkeypatch.setenv(INJECT_OOM_ENV, str(save_steps + 2))
    with pytest.raises(torch.OutOfMemoryError):
        run(tmp_path / "cut")
    assert sorted(per_step(tmp_path / "cut")) == list(range(1, save_steps + 2))
    epochs.clear()
    steps, resumed_from = run(tmp_path / "cut")  # the marker file stops the hook from firing again
    assert epochs == [1]  # the resumed loader (accelerate's skip wrapper around ours) got the epoch too
    assert resumed_from.endswith(f"checkpoint-{save_steps}") and steps == total
    a, b = per_step(tmp_path / "whole"), per_step(tmp_path / "cut")
    assert sorted(a) == sorted(b) == list(range(1, total + 1))
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5), step
