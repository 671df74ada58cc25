"""A finished sweep's table, the GPU-hours pruning saved, and the best trial as a ready `--overrides` file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from medgpt_ray.config import ConfigError
from medgpt_ray.tune.sweep import SweepConfig, format_table, override_lines


def _rows(grid, sweep: SweepConfig) -> list[dict[str, Any]]:
    rows = []
    for r in grid:
        m = r.metrics or {}
        params = {k: v for k, v in (r.config or {}).items()}
        status = "error" if r.error else "pruned" if m.get("pruned") else "done" if m.get("completed") else "stopped"
        value = m.get(sweep.metric)
        rows.append({"trial": m.get("trial_id") or r.path.rsplit("_", 1)[-1], "status": status,
                     "predicted_peak_gib": m.get("predicted_peak_gib"), "measured_peak_gib": m.get("measured_peak_gib"),
                     sweep.metric: None if status == "pruned" or value is None else value, "params": params,
                     "predicted_run_s": m.get("predicted_run_s"), "reason": m.get("reason")})
    return rows


def summarise(grid, sweep: SweepConfig, out: Path, echo: Callable[[str], None],
              start: dict[str, Any] | None = None) -> dict[str, Any]:
    """The table, the best trial's overrides and sweep_results.json; `start`: what the trials started from (its
    starts_from and needs, tune/upstream.py), kept in the results with them."""
    rows = _rows(grid, sweep)
    ran = [r for r in rows if r["status"] in ("done", "stopped") and r[sweep.metric] is not None]
    finished = [r.metrics for r in grid if not r.error and (r.metrics or {}).get("completed")]
    if finished and not ran:
        reported = sorted(k for k, v in finished[0].items() if k.startswith("eval_") and isinstance(v, int | float))
        raise ConfigError(f"sweep metric: no trial reported {sweep.metric!r}; the {sweep.stage} stage reports "
                          f"{', '.join(reported) or 'no eval_ metric'}")
    pruned = [r for r in rows if r["status"] == "pruned"]
    saved = sum(r["predicted_run_s"] or 0 for r in pruned)
    best = (min if sweep.mode == "min" else max)(ran, key=lambda r: r[sweep.metric]) if ran else None
    echo(format_table(rows, sweep.metric))
    echo(f"pruned {len(pruned)} of {len(rows)} trial(s) before launch, saving ~{saved / 3600:.2f} GPU-hours "
         f"(their predicted run time)")
    summary = {"rows": rows, "pruned": len(pruned), "saved_gpu_s": saved, "best": best, **(start or {})}
    if best is not None:
        path = out / "best_overrides.yaml"
        path.write_text(yaml.safe_dump(override_lines(sweep.stage, best["params"]), sort_keys=True))
        summary["best_overrides"] = str(path)
        echo(f"best: trial {best['trial']} {sweep.metric}={best[sweep.metric]:.4f} -> {path} "
             f"(python jobs/pipeline.py --config ... --overrides {path})")
    (out / "sweep_results.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
