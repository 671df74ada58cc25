"""A sweep's dry run: sampled trials planned as their stage would be (StageJob.plan, from `model.shape` where the
model directory is not here), the ones that cannot fit said; nothing runs and no data is read."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from medgpt_ray.config import ConfigError
from medgpt_ray.memory.budget import Budget
from medgpt_ray.memory.planner import PlanError
from medgpt_ray.run.job import StageJob
from medgpt_ray.tune.sweep import SweepConfig, format_table, predicted_run_seconds, trial_config


def sample(sweep: SweepConfig, n: int) -> list[dict[str, Any]]:
    """Configurations for a dry run: the grid, or seeded random draws of the space."""
    rng = random.Random(sweep.seed)
    if sweep.searcher == "grid":
        keys = list(sweep.space)
        values = [next(iter(sweep.space[k].values())) for k in keys]
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]
    out = []
    for _ in range(n):
        p = {}
        for key, spec in sweep.space.items():
            (kind, v), = spec.items()
            if kind in ("choice", "grid"):
                p[key] = rng.choice(v)
            elif kind == "uniform":
                p[key] = rng.uniform(*v)
            elif kind == "loguniform":
                p[key] = 10 ** rng.uniform(math.log10(v[0]), math.log10(v[1]))
            else:
                p[key] = rng.randint(v[0], v[1] - 1)  # tune.randint's upper bound is exclusive
        out.append(p)
    return out


def dry_run(sweep: SweepConfig, base: dict[str, Any], budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    """Plan sampled trials and say which would be pruned. The data may not be here: run times of pruned trials
    are predicted per 10k records."""
    stage, rows = sweep.stage, []
    for i, params in enumerate(sample(sweep, sweep.num_samples)):
        c = trial_config(base, stage, params)
        try:
            p = StageJob(c, stage, Path(), echo).plan(budget)
            rows.append({"trial": f"dry_{i}", "status": "fits", "predicted_peak_gib": p.prediction.peak_gib,
                         "params": params})
        except PlanError as e:
            rows.append({"trial": f"dry_{i}", "status": "pruned", "predicted_peak_gib": e.smallest_peak_gib,
                         "params": params, "predicted_run_s": predicted_run_seconds(c, stage, 10_000)})
        except ConfigError as e:  # as a real trial takes it (tune/trial.py): pruned as invalid, the sweep goes on
            rows.append({"trial": f"dry_{i}", "status": "invalid", "predicted_peak_gib": None, "params": params,
                         "reason": str(e).splitlines()[0][:300]})
    echo(format_table(rows, sweep.metric))
    invalid = [r for r in rows if r["status"] == "invalid"]
    for r in invalid[:3]:
        echo(f"{r['trial']} is invalid: {r['reason']}")
    echo(f"would prune {sum(r['status'] != 'fits' for r in rows)} of {len(rows)}"
         + (f" ({len(invalid)} invalid)" if invalid else ""))
    return {"rows": rows, "dry_run": True}
