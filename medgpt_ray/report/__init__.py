"""A run's report: one self-contained HTML file (figures embedded as PNG data URIs, no network) with the stage
graph, the data funnel, a Tune sweep's trials, the eval stage's comparison of the models and, per stage, the plan
against the memory budget, loss and learning-rate curves, throughput, GPU memory and held-out results.

    medgpt-ray report runs/<name> [--out FILE.html]

The pipeline writes runs/<name>/report.html at the end of every run (write_run_report). It quotes no record
text: only counts, metrics and config values (report/rundata.py reads nothing else).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

REPORT_FILE = "report.html"
# Set in the test suite: a report that cannot be written fails the run there instead of printing a warning.
STRICT_ENV = "MEDGPT_RAY_REPORT_STRICT"


def build_report(run_dir: str | Path) -> str:
    from medgpt_ray.report import sections
    from medgpt_ray.report.eval_section import anchor, eval_section
    from medgpt_ray.report.html import esc, page
    from medgpt_ray.report.rundata import read_run

    run = read_run(run_dir)
    stages = sections.active(run)
    stage_parts = [sections.stage_section(s) for s in stages]
    # The evaluation's link says "evaluation": the stage that made it is listed under its own name too.
    nav = [("run", "run"), ("data", "data"), ("sweep", "sweep"), (anchor(), "evaluation"),
           *[(f"stage-{s.name}", f"{s.name} stage" if s.name == anchor() else s.name) for s in stages]]
    meta = (f"{esc(run.run_dir)} · written {esc(time.strftime('%Y-%m-%d %H:%M:%S'))} by "
            f"<code>medgpt-ray report</code>")
    return page(f"medgpt-ray run {run.name}", meta, nav,
                [sections.run_section(run), sections.data_section(run), sections.sweep_section(run),
                 eval_section(run.evaluation), *stage_parts])


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of `run_dir` (default: run_dir/report.html) atomically; returns its path."""
    path = Path(out) if out is not None else Path(run_dir) / REPORT_FILE
    text = build_report(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def write_run_report(run_dir: Path, echo: Callable[[str], None]) -> Path | None:
    """The pipeline's last step: write the report and say where it is. A report that cannot be written does
    not undo a finished run: a warning names the error (under $MEDGPT_RAY_REPORT_STRICT it is raised)."""
    try:
        path = write_report(run_dir)
    except Exception as e:
        if os.environ.get(STRICT_ENV):
            raise
        echo(f"warning: the run's report was not written ({type(e).__name__}: {e}); "
             f"retry with `medgpt-ray report {run_dir}`")
        return None
    echo(f"report: {path} (open it in a browser)")
    return path
