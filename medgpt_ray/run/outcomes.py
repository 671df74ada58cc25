"""What each stage of a run came to, and the run's summary.json built from it (written after every wave, so it says
what this run is doing, never what an earlier one did)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medgpt_ray.config import PipelineConfig, run_evaluator
from medgpt_ray.report import write_run_report
from medgpt_ray.run import eval_report, pair_report
from medgpt_ray.run.manifest import Manifest, write_json_atomic
from medgpt_ray.run.progress import format_summary, summary_entry


@dataclass
class StageOutcome:
    stage: str
    status: str  # done | skipped | disabled | passed-on | failed | not-run | pending | interrupted
    result: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    error: str | None = None


def _not_running(cfg: PipelineConfig, stage: str) -> str:
    """The status of a stage that does not run: passed-on (max_steps 0: its input model goes on), or disabled."""
    return "passed-on" if cfg.passes_on(stage) else "disabled"


class RunSummary:
    """The run's summary.json (and at its end the table and report.html), from the stages' outcomes."""

    def __init__(self, cfg: PipelineConfig, run_dir: Path, manifest: Manifest, echo: Callable[[str], None]):
        self.cfg, self.run_dir, self.manifest, self.echo = cfg, run_dir, manifest, echo
        self.baselines: dict[str, Any] | None = None  # pair_report.run_baselines, once the data is prepared

    def with_pending(self, outcomes: dict[str, StageOutcome], to_run: list[str], status: str = "pending"
                     ) -> dict[str, StageOutcome]:
        """`outcomes` so far, plus `status` for the stages this run still has to finish and the manifest's
        word for the rest (skipped: done earlier)."""
        full = dict(outcomes)
        for s in self.cfg.stages.kinds():
            if s in full:
                continue
            if not self.cfg.runs(s):
                full[s] = StageOutcome(s, _not_running(self.cfg, s))
            elif s in to_run:
                full[s] = StageOutcome(s, status)
            else:
                full[s] = StageOutcome(s, "skipped", self.manifest.entry(s) or {})
        return full

    def final(self, outcomes: dict[str, StageOutcome]) -> dict[str, StageOutcome]:
        """`outcomes` with every stage that has none: disabled, or not run (a wave before it failed)."""
        full = dict(outcomes)
        for s in self.cfg.stages.kinds():
            if s not in full:
                status = _not_running(self.cfg, s) if not self.cfg.runs(s) else "not-run"
                full[s] = StageOutcome(s, status, self.manifest.entry(s) or {} if status == "not-run" else {})
        return full

    def write(self, outcomes: dict[str, StageOutcome], wall_s: float, quiet: bool = False) -> dict[str, Any]:
        stages, evaluator = {}, run_evaluator()  # the stage that compares the run's models (eval)
        for s in self.cfg.stages.kinds():
            o = outcomes[s]
            r = o.result.get("result", o.result) if o.status in ("skipped", "not-run") else o.result
            wall = round(o.wall_s, 2) if o.status in ("done", "failed") else r.get("wall_s")
            stages[s] = summary_entry(o.status, r, wall, o.error)
        summary = {"name": self.cfg.name, "run_dir": str(self.run_dir), "wall_s": round(wall_s, 2),
                   "stages": stages, **pair_report.summary_fields(self.cfg, stages, self.baselines),
                   **eval_report.summary_fields(outcomes.get(evaluator) if evaluator else None)}
        write_json_atomic(self.run_dir / "summary.json", summary)
        if not quiet:  # the run's end, also after a failed stage: the table, then runs/<name>/report.html
            self.echo(format_summary(summary))
            write_run_report(self.run_dir, self.echo)
        return summary
