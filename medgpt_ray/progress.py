"""The progress lines users see: a training step's line and an ETA. Pure formatting; the actor that carries the
records from Ray workers to the driver, and the cleaner's live line, are in run/progress.py."""

from __future__ import annotations

from typing import Any


def format_eta(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def remaining_s(rec: dict[str, Any], step: int, total: int) -> float | None:
    """Seconds left at the pace of the steps after the attempt's first (which compiles, autotunes and warms up: on a
    7B layer tens of seconds), or of all steps where none came after it yet."""
    if not (step and total):
        return None
    first, first_s = rec.get("first_step"), rec.get("first_step_s")
    if first is not None and first_s is not None and step > first:
        return (rec["time_s"] - first_s) / (step - first) * (total - step)
    return rec["time_s"] / step * (total - step)


def progress_line(rec: dict[str, Any]) -> str:
    step, total = rec.get("step", 0), rec.get("total_steps") or 0
    parts = [f"[{rec.get('stage', '?'):>3}] step {step}/{total}"]
    if rec.get("phase") == "compiling":  # sent when training starts on compiled layers, before the first step
        return "  ".join([*parts, "first step: compiling the layers (kept in the compile cache for later runs); "
                                  "the ETA follows the steps after it"])
    eta = remaining_s(rec, step, total)
    if "loss" in rec:
        parts.append(f"loss {rec['loss']:.4f}")
    if "tokens_per_s" in rec:
        parts.append(f"{rec['tokens_per_s']:,.0f} tok/s")
    if "learning_rate" in rec:
        parts.append(f"lr {rec['learning_rate']:.2e}")
    if "gpu_peak_gib" in rec:
        budget = f"/{rec['gpu_budget_gib']:.1f}" if rec.get("gpu_budget_gib") else ""
        parts.append(f"mem {rec['gpu_peak_gib']:.1f}{budget} GiB")
    parts.append(f"ETA {format_eta(eta)}")
    return "  ".join(parts)
