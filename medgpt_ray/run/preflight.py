"""What a run can check before Ray starts or a stage is planned: the model directory, every data path, and
whether the workers fit the CPUs there are. Each problem is a ConfigError naming the config key, so a mistake
costs a second, not a cluster start (or, for too many workers, a Ray Train retry loop that never ends)."""

from __future__ import annotations

import os
from pathlib import Path

from medgpt_ray.config import ConfigError, PipelineConfig
from medgpt_ray.data.input_paths import expand_paths
from medgpt_ray.data.kinds import KINDS, DataFileError

DATA_KEYS = (*KINDS, "raw")  # every data.<kind> list, and data.raw


def check_paths(cfg: PipelineConfig) -> None:
    if cfg.model.path != "tiny":
        from medgpt_ray.models import resolve_model_path

        try:
            resolve_model_path(cfg.model.path)
        except OSError as e:  # ModelPathError
            raise ConfigError(str(e)) from None
    check_teachers(cfg)
    for key in DATA_KEYS:
        for path in cfg.data.paths(key):
            try:
                files = expand_paths([path])
            except DataFileError as e:
                raise ConfigError(f"data.{key}: {e}") from None
            if all(f.stat().st_size == 0 for f in files):  # found now, not after Ray has started
                raise ConfigError(f"data.{key}: {path} is empty (0 bytes): no records to read; give a file with "
                                  "records or leave it out")


def check_teachers(cfg: PipelineConfig) -> None:
    """A teacher given as a model directory (opd's `teacher: ./dir`) must exist and tokenize as the student does."""
    from medgpt_ray.models import resolve_model_path, vocabulary_difference
    from medgpt_ray.tiny import ensure_tiny

    for name in cfg.enabled_stages():
        stage = cfg.stages.get(name)
        if getattr(stage, "teacher_is_stage", True):
            continue
        teacher = Path(stage.teacher).expanduser()
        if not (teacher / "config.json").is_file():
            raise ConfigError(f"stages.{name}.teacher: {teacher} is not a model directory (no config.json)")
        student = ensure_tiny() if cfg.model.path == "tiny" else resolve_model_path(cfg.model.path)
        if (why := vocabulary_difference(student, teacher)) is not None:
            raise ConfigError(f"stages.{name}.teacher: {teacher} does not share the student's tokenizer "
                              f"({student}): {why}")


def check_cpus(cfg: PipelineConfig, cpus: float, where: str) -> None:
    """Every enabled stage's workers x resources.cpus_per_worker within `cpus` (Ray Train would wait for them
    forever, retrying every minute)."""
    per_worker = cfg.resources.cpus_per_worker
    for stage in cfg.enabled_stages():
        workers = cfg.workers_for(stage)
        if workers * per_worker > cpus:
            key = f"stages.{stage}.num_workers" if cfg.stages.get(stage).num_workers else "resources.num_workers"
            raise ConfigError(f"{key}: stage {stage} needs {workers} worker(s) x {per_worker:g} CPU "
                              f"(resources.cpus_per_worker) = {workers * per_worker:g} CPUs, but {where} has "
                              f"{cpus:g}; lower {key} or resources.cpus_per_worker, or add nodes")


def check_gpus(cfg: PipelineConfig, gpus: float, where: str) -> None:
    if not cfg.resources.use_gpu:
        return
    for stage in cfg.enabled_stages():
        if cfg.workers_for(stage) > gpus:
            raise ConfigError(f"resources.num_workers: stage {stage} needs {cfg.workers_for(stage)} GPU worker(s), "
                              f"but {where} has {gpus:g} GPU(s)")


def check_writable(run_dir: Path) -> None:
    """ConfigError when the run directory, or a directory an earlier attempt left in it, cannot be written (read-only,
    immutable, another user's): said before Ray starts, not as a traceback after it. A probe file is written and
    removed in each, as permissions alone miss an immutable directory and a read-only mount."""
    dirs = [run_dir, *sorted(d for d in run_dir.iterdir() if d.is_dir())] if run_dir.is_dir() else []
    for d in dirs:
        probe = d / f".medgpt-write-probe-{os.getpid()}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise ConfigError(f"output_dir: {d} cannot be written ({e.strerror}); make it writable, or give "
                              "another output_dir or name") from None
