"""A run's first step (issue 48, "First steps"): compiled layers announce it before it starts, the ETA follows the
steps after it (it compiles, autotunes and warms up: tens of seconds on a 7B layer), and torch.compile's inductor and
Triton caches sit under the cache directory so that a later run of the same config loads them."""

from __future__ import annotations

from transformers import TrainerControl, TrainerState, TrainingArguments

from medgpt_ray.progress import progress_line
from medgpt_ray.run.progress import ProgressPrinter
from medgpt_ray.stages.callbacks import StageProgress
from medgpt_ray.stages.speed import RecompileCount
from medgpt_ray.tiny import use_compile_caches


def test_the_eta_follows_the_steps_after_the_first():
    """60 s for the compiled first step, then 2 s a step: at step 3 of 10, 7 steps x 2 s are left, where the pace of
    all three steps (64 s / 3) would say 2m29s."""
    rec = {"stage": "sft", "step": 3, "total_steps": 10, "time_s": 64.0, "loss": 1.0}
    assert progress_line(rec).endswith("ETA 2m29s")
    assert progress_line({**rec, "first_step": 1, "first_step_s": 60.0}).endswith("ETA 0m14s")
    resumed = {**rec, "step": 13, "total_steps": 20, "first_step": 11, "first_step_s": 60.0}  # resumed after step 10
    assert progress_line(resumed).endswith("ETA 0m14s")


def test_compiled_layers_announce_their_first_step_and_its_time_reaches_the_records(tmp_path):
    sent: list[dict] = []
    progress = StageProgress("sft", tmp_path / "metrics.jsonl", sent.append, None, RecompileCount())
    args, control, state = TrainingArguments(output_dir=str(tmp_path), report_to="none"), TrainerControl(), \
        TrainerState()
    state.max_steps = 5
    progress.on_train_begin(args, state, control)
    assert sent == [{"stage": "sft", "step": 0, "total_steps": 5, "phase": "compiling"}]
    lines: list[str] = []
    ProgressPrinter(10, lines.append).feed(sent)
    assert len(lines) == 1 and "first step: compiling" in lines[0] and "ETA ?" not in lines[0]
    state.global_step = 1
    progress.on_step_end(args, state, control)
    progress.on_log(args, state, control, logs={"loss": 2.0})
    assert sent[-1]["first_step"] == 1 and sent[-1]["first_step_s"] >= 0
    eager: list[dict] = []
    StageProgress("sft", tmp_path / "m2.jsonl", eager.append, None, None).on_train_begin(args, TrainerState(), control)
    assert eager == []  # nothing compiles: no announcement


def test_compile_caches_live_under_the_cache_dir_and_an_explicit_one_wins(tmp_path, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    monkeypatch.setenv("MEDGPT_RAY_CACHE", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    used = use_compile_caches()
    assert used == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "mine")}
    assert cache_dir() == str(tmp_path / "inductor")  # what inductor itself now reads


def test_start_up_marks_are_seconds_after_the_start_line_and_a_skewed_clock_gives_none():
    from medgpt_ray.run.wave import startup_seconds

    marks = {"first_step": 115.0, "worker_up": 104.0, "trainer_built": 110.0, "worker_process": 101.5,
             "train_fn": 103.25, "model_and_data": 108.0, "fit": 100.5}
    assert list(startup_seconds(marks, 100.0).items()) == [  # in the order they happen
        ("fit_s", 0.5), ("worker_process_s", 1.5), ("train_fn_s", 3.2), ("worker_up_s", 4.0), ("model_and_data_s", 8.0),
        ("trainer_built_s", 10.0), ("first_step_s", 15.0)]
    assert startup_seconds({"worker_up": 99.0, "first_step": 103.0}, 100.0) == {}  # a worker's clock behind ours
    # A worker process Ray reused started before the line: that mark alone goes.
    assert startup_seconds({"worker_process": 42.0, "worker_up": 104.0}, 100.0) == {"worker_up_s": 4.0}


def test_a_process_knows_when_it_started():
    import time

    from medgpt_ray.run.process_clock import process_started_wall

    started = process_started_wall()
    # /proc's boot time is whole seconds; this test process has run for at least its imports, at most the session
    assert started is not None and -1.5 < time.time() - started < 3600
