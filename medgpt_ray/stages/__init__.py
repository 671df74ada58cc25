"""One module per training stage; each builds its HF/TRL trainer from a StagePlan.

Stages are plain functions callable in any process: `run_stage(inputs, sink)`.
Ray only wraps them (pipeline.py), so a unit test can call them directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from medgpt_ray.stages.common import StageInputs


def run_stage(inputs: StageInputs, sink: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    from medgpt_ray.stages import dpo, pt, rm, sft

    runners = {"pt": pt.run, "sft": sft.run, "rm": rm.run, "dpo": dpo.run}
    return runners[inputs.stage](inputs, sink)


def build_stage(inputs: StageInputs, sink: Callable[[dict[str, Any]], None] | None = None):
    """The stage's trainer, built exactly as run_stage builds it, not yet trained (memory calibration)."""
    import importlib

    return importlib.import_module(f"medgpt_ray.stages.{inputs.stage}").build(inputs, sink)
