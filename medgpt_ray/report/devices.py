"""The plan table's device and budget cells: the device a stage really ran on beside the one its plan was sized and
timed for, and what stands for the GPU budget on a CPU run (issue 36: an H200 run read "NVIDIA GeForce RTX 4090",
the planning target; a CPU run read "budget GiB –").

The planning target is the plan's prediction `gpu`: resources.gpu_type, else the GPU read on the driver, else an
RTX 4090 (memory/budget.py make_budget), whose speed the plan predicts. The device is what each training worker
found when it ran (stages/outputs.py worker_placement: torch's device name, into result.json's `workers`)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from medgpt_ray.report.rundata import StageData


def _device(worker: dict[str, Any]) -> str:
    if worker.get("gpu_name"):
        return str(worker["gpu_name"])
    return "CPU" if worker.get("device", "cpu") == "cpu" else str(worker.get("device"))


def ran_on(stage: StageData) -> str:
    """'2 x NVIDIA H200 (1 host)', from result.json's workers; or why it is not known."""
    workers = [w for w in (stage.result or {}).get("workers") or [] if isinstance(w, dict)]
    if not workers:
        return "not recorded (no result.json with its workers: the stage did not finish in this directory)"
    counts = Counter(_device(w) for w in workers)
    hosts = len({w.get("host") for w in workers})
    devices = ", ".join(f"{n} x {name}" for name, n in counts.items())
    return f"{devices} ({hosts} host{'s' if hosts != 1 else ''})"


def device_rows(stage: StageData) -> list[tuple[str, Any]]:
    """The plan table's device rows: the device the stage ran on, the target its plan was sized for, and a
    sentence when they differ."""
    pred = (stage.plan or {}).get("prediction") or {}
    target = pred.get("gpu")
    rows: list[tuple[str, Any]] = [("ran on", ran_on(stage)),
                                   ("planned for (speed model)", target or "not recorded in plan.json")]
    workers = [w for w in (stage.result or {}).get("workers") or [] if isinstance(w, dict)]
    names = {_device(w) for w in workers}
    if target and names and names != {target} and (stage.plan or {}).get("use_gpu"):
        rows.append(("note", f"the plan's speed was predicted for {target}, not the {', '.join(sorted(names))} "
                             f"the stage ran on (resources.gpu_type plans for another card)"))
    return rows


def budget_cell(plan: dict[str, Any]) -> Any:
    """The per-GPU budget in GiB, or what stands for it: a CPU run has none (its workers share host RAM: the
    'budget from' row)."""
    budget = ((plan.get("prediction") or {}).get("budget_gib"))
    if budget is not None:
        return budget
    if not plan.get("use_gpu"):
        return "CPU run: no GPU budget (host RAM instead: see 'budget from')"
    return "none: no GPU memory limit was set or read"
