"""What the stage kinds' modules share (inputs, outputs, callbacks, telemetry, rewards, ...), and the entry that
runs one: each kind's module (kinds/<kind>/stage.py unless its registry entry names another) builds its HF/TRL
trainer from a StagePlan.

Stages are plain functions callable in any process: `run_stage(inputs, sink, callbacks)`. Ray only wraps them
(run/stage_runner.py), so a test can call them directly; what Ray needs inside a worker (a report callback, a
progress sink) is injected by the runner.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

from medgpt_ray.config import stage_kind
from medgpt_ray.stages.inputs import BuiltStage, StageInputs


def _module(inputs: StageInputs):
    """The stage kind's module (config.STAGE_KINDS): medgpt_ray.kinds.<kind>.stage unless its entry names another."""
    return importlib.import_module(inputs.module or stage_kind(inputs.stage).module_name)


def run_stage(inputs: StageInputs, sink: Callable[[dict[str, Any]], None] | None = None,
              callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    return _module(inputs).run(inputs, sink, callbacks)


def build_stage(inputs: StageInputs, sink: Callable[[dict[str, Any]], None] | None = None) -> BuiltStage:
    """The stage's trainer, built exactly as run_stage builds it, not yet trained (memory calibration)."""
    return _module(inputs).build(inputs, sink)
