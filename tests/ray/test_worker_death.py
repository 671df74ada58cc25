"""A training worker's process SIGKILLed mid-stage (what the host's OOM killer or a crash does): the pipeline
restarts the stage from its newest checkpoint by itself and trains what an uninterrupted run trains."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from medgpt_ray.run.pipeline import Pipeline, RunOptions
from medgpt_ray.stages.callbacks import PAUSE_AT_STEP_ENV

pytestmark = pytest.mark.ray


def kill_when_paused(marker, killed: list[int], timeout_s: float = 120.0) -> threading.Thread:
    """SIGKILL the worker whose pid appears in `marker` (the pause hook writes it once its step is logged)."""

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if marker.exists():
            pid = int(marker.read_text())
            if pid != os.getpid():  # a Ray worker's process, never this one
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    t = threading.Thread(target=watch, name="kill-worker", daemon=True)
    t.start()
    return t


def test_a_killed_worker_restarts_the_stage_from_its_checkpoint_with_the_same_result(tiny_run, tmp_path,
                                                                                     monkeypatch):
    """The shared tiny run's config (1 worker, 12 steps of sft) with a checkpoint every 4 steps; the worker is
    killed once step 6 is logged (between checkpoint-4 and the next). Saving checkpoints changes no update (nor
    the RNG: HF saves its state, and a resume restores it), so the uninterrupted reference is the shared tiny run
    itself.
    Measured on the shared 2-core box: 40 s (load 7-14) to 59 s (load 9), the shared tiny run not counted; nearly
    all of it is two Ray Train start-ups (~17-22 s each here: the killed attempt's and the restart's)."""
    cfg = tiny_run.cfg.model_copy(deep=True)
    cfg.name, cfg.output_dir = "killed", str(tmp_path)
    cfg.stages.get("sft").save_steps = 4
    monkeypatch.setenv(PAUSE_AT_STEP_ENV, "6")
    stage_dir = tmp_path / "killed" / "sft"
    killed: list[int] = []
    watcher = kill_when_paused(stage_dir / ".paused_worker", killed)
    lines: list[str] = []
    summary = Pipeline(cfg, RunOptions(echo=lines.append)).run()
    watcher.join(timeout=1)
    assert len(killed) == 1, "the worker never paused at step 6"
    assert summary["stages"]["sft"]["status"] == "done"
    assert f"[sft] worker died (rank 0, pid {killed[0]}): restarting from checkpoint-4 (restart 1 of 2)" in lines
    result = json.loads((stage_dir / "result.json").read_text())
    assert result["resumed_from"].endswith("checkpoint-4") and result["steps"] == tiny_run.max_steps
    steps = [json.loads(line)["step"] for line in (stage_dir / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == list(range(1, tiny_run.max_steps + 1))  # steps 5.. of the dead attempt are not there twice
    reference = tiny_run.summary["stages"]["sft"]
    assert result["train_loss_last"] == pytest.approx(reference["train_loss_last"], abs=1e-6)
    assert result["eval"]["eval_loss"] == pytest.approx(reference["eval"]["eval_loss"], abs=1e-6)
