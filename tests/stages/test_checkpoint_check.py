"""A checkpoint cut short (a worker died while saving, a full disk) is found by cheap checks on real checkpoints of
the tiny model, set aside, and the stage resumes from the one before it and trains what an uninterrupted run
trains; metrics.jsonl then holds each step once."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from medgpt_ray.config import LoraConfig, StageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.run.backoff import usable_checkpoint
from medgpt_ray.stages import build_stage
from medgpt_ray.stages.callbacks import INJECT_OOM_ENV
from medgpt_ray.stages.checkpoint_check import checkpoint_problem, set_aside_unreadable
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.stages.outputs import latest_checkpoint, train
from tests.stages.test_resume_batches import per_step


def cut(path: Path, keep: float = 0.5) -> tuple[int, int]:
    """Truncate the file to `keep` of its length (what a process killed mid-write leaves): (new, old) size."""
    size = path.stat().st_size
    os.truncate(path, int(size * keep))
    return int(size * keep), size


@pytest.fixture(scope="module")
def stage(repo, tiny_model, tmp_path_factory):
    """A tiny SFT stage of 6 steps, checkpointed every 2 (save_total_limit keeps the newest two), trained whole
    once: `run(out)` trains it into `out`, resuming as run_stage does."""
    data = prepare_kind("sft", [str(repo / "data/sample/sft_sharegpt.jsonl")], tmp_path_factory.mktemp("data"), 0.1,
                        max_records=12)
    cfg = StageConfig(method="lora", lora=LoraConfig(rank=8, alpha=16, dropout=0.0), lr=5e-3, max_steps=6,
                      seq_len=512, effective_batch=4, micro_batch=2, logging_steps=1, save_steps=2,
                      warmup_ratio=0.0)
    plan = plan_stage("sft", cfg, 1, False)

    def inputs(out: Path) -> StageInputs:
        out.mkdir(exist_ok=True)
        return StageInputs("sft", cfg, plan, str(tiny_model), "chatml", data.train_file, data.eval_file, str(out))

    def run(out: Path) -> tuple[int, str | None]:
        built = build_stage(inputs(out))
        resumed_from = train(built.trainer, inputs(out))[1]
        return built.trainer.state.global_step, resumed_from

    whole = tmp_path_factory.mktemp("whole")
    assert run(whole) == (6, None)
    return inputs, run, whole


def test_intact_checkpoints_are_readable_and_cut_files_are_named(stage, tmp_path):
    ckpts = stage[2] / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    for c in ckpts.glob("checkpoint-*"):
        assert checkpoint_problem(c) is None, c.name
    c = tmp_path / "checkpoint-6"
    shutil.copytree(ckpts / "checkpoint-6", c)
    for name in ("adapter_model.safetensors", "optimizer.pt", "rng_state.pth", "trainer_state.json"):
        assert (c / name).is_file(), name  # what HF writes for a LoRA stage: each format is checked
    new, old = cut(c / "adapter_model.safetensors")
    assert checkpoint_problem(c) == f"adapter_model.safetensors: truncated, {new:,} of {old:,} bytes"
    shutil.copy(ckpts / "checkpoint-6" / "adapter_model.safetensors", c)
    new, _ = cut(c / "optimizer.pt", 0.9)  # the tensors are all there, the zip's directory at the end is not
    assert checkpoint_problem(c) == f"optimizer.pt: not a complete zip file (truncated?), {new:,} bytes"
    shutil.copy(ckpts / "checkpoint-6" / "optimizer.pt", c)
    new, _ = cut(c / "trainer_state.json", 0.99)
    assert checkpoint_problem(c) == f"trainer_state.json: JSON does not parse (truncated?), {new:,} bytes"
    shutil.copy(ckpts / "checkpoint-6" / "trainer_state.json", c)
    (c / "global_step6").mkdir()  # where DeepSpeed writes its torch files
    torch.save({"module": torch.ones(64)}, c / "global_step6" / "mp_rank_00_model_states.pt")
    assert checkpoint_problem(c) is None
    new, _ = cut(c / "global_step6" / "mp_rank_00_model_states.pt", 0.95)
    assert checkpoint_problem(c) == (f"global_step6/mp_rank_00_model_states.pt: not a complete zip file "
                                     f"(truncated?), {new:,} bytes")
    shutil.rmtree(c / "global_step6")
    cut(c / "adapter_model.safetensors", 8 / (c / "adapter_model.safetensors").stat().st_size)
    assert checkpoint_problem(c).startswith("adapter_model.safetensors: truncated, 8 of at least ")


def test_set_aside_renames_the_unreadable_newest_and_returns_the_one_before(stage, tmp_path):
    ckpts = tmp_path / "checkpoints"
    shutil.copytree(stage[2] / "checkpoints", ckpts)
    assert set_aside_unreadable(ckpts) == ([], str(ckpts / "checkpoint-6"))  # nothing to do: nothing moves
    cut(ckpts / "checkpoint-6" / "adapter_model.safetensors")
    aside, newest = set_aside_unreadable(ckpts)
    assert [(a, c) for a, _, c in aside] == [("checkpoint-6", "corrupt-checkpoint-6")]
    assert aside[0][1].startswith("adapter_model.safetensors: truncated")
    assert newest == latest_checkpoint(ckpts) == str(ckpts / "checkpoint-4")
    # A later attempt cut short at the same step: the one set aside before stays as it is.
    shutil.copytree(ckpts / "corrupt-checkpoint-6", ckpts / "checkpoint-6")
    assert [c for _, _, c in set_aside_unreadable(ckpts)[0]] == ["corrupt-checkpoint-6.2"]
    cut(ckpts / "checkpoint-4" / "optimizer.pt")
    assert set_aside_unreadable(ckpts)[1] is None  # none left: the stage starts from the beginning
    assert sorted(p.name for p in ckpts.glob("*checkpoint-*")) == ["corrupt-checkpoint-4", "corrupt-checkpoint-6",
                                                       "corrupt-checkpoint-6.2"]


def test_resume_after_a_cut_newest_checkpoint_trains_what_the_whole_run_trains(stage, tmp_path, monkeypatch):
    inputs, run, whole = stage
    out = tmp_path / "cut"
    monkeypatch.setenv(INJECT_OOM_ENV, "6")  # after checkpoint-4 and the log of step 5: a dead attempt's steps
    with pytest.raises(torch.OutOfMemoryError):
        run(out)
    assert sorted(per_step(out)) == [1, 2, 3, 4, 5]
    new, old = cut(out / "checkpoints" / "checkpoint-4" / "adapter_model.safetensors")
    lines: list[str] = []
    assert usable_checkpoint(inputs(out), lines.append) == str(out / "checkpoints" / "checkpoint-2")
    assert lines == [f"[sft] checkpoint-4 is unreadable (adapter_model.safetensors: truncated, {new:,} of {old:,} "
                     "bytes): set aside as corrupt-checkpoint-4; resuming from checkpoint-2"]
    steps, resumed_from = run(out)  # the OOM marker file stops the hook from firing again
    assert resumed_from.endswith("checkpoint-2") and steps == 6
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    a, b = per_step(whole), per_step(out)  # per_step fails on a step logged twice
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]  # and in order
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5), step
