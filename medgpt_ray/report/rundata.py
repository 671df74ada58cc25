"""A run directory read into plain data for the report: the files the pipeline, the cleaner and a Tune sweep write,
and nothing else. Every piece may be missing (a stage skipped or failed, no cleaning step, no sweep): what is
absent is None or empty, never an error.

Only counts, metrics and config values are read. Record text is never read: the data/ Parquet files are not
opened, and of a quarantine file only each line's `reason` is taken (reasons name fields and positions, never
values: data/prepare.py).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medgpt_ray.config import STAGE_KINDS, run_evaluator, stage_kind

PREPARED_FILE = "prepared.json"  # runs/<name>/data/prepared.json, written by the pipeline after preparing


@dataclass
class StageData:
    name: str
    status: str  # the summary's: done | skipped | disabled | failed | not-run | pending | interrupted
    after: list[str]  # the stages it starts from or needs
    wall_s: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)  # summary.json's row
    plan: dict[str, Any] | None = None  # plan.json
    metrics: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl, in order
    result: dict[str, Any] | None = None  # result.json
    config: dict[str, Any] = field(default_factory=dict)  # the stage's resolved config

    @property
    def train_records(self) -> list[dict[str, Any]]:
        return [m for m in self.metrics if "loss" in m]

    @property
    def eval_records(self) -> list[dict[str, Any]]:
        return [m for m in self.metrics if any(k.startswith("eval_") for k in m)]

    @property
    def measured_peak_gib(self) -> float | None:
        peaks = [m["gpu_peak_gib"] for m in self.metrics if isinstance(m.get("gpu_peak_gib"), int | float)]
        return max(peaks) if peaks else None


@dataclass
class SweepData:
    name: str  # the sweep's directory, <name>-tune-<stage>
    metric: str | None
    rows: list[dict[str, Any]]  # one per trial: trial, status (done|stopped|pruned|error), params, metric value
    best: dict[str, Any] | None


@dataclass
class RunData:
    run_dir: Path
    name: str
    wall_s: float | None
    stages: list[StageData]
    run_info: dict[str, Any]  # the manifest's: git commit, packages, driver host
    clean: dict[str, Any] | None  # clean/report.json (data.raw cleaned as the first step)
    prepared: dict[str, Any] | None  # data/prepared.json: per kind, source/train/held-out/quarantined counts
    sweeps: list[SweepData]
    evaluation: dict[str, Any] | None = None  # summary.json's `eval`: the eval stage's results.json


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by a killed process
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _after(name: str, conf: dict[str, Any]) -> list[str]:
    start = conf.get("from")
    if start is None and name in STAGE_KINDS:
        start = stage_kind(name).default_from
    return [*([start] if start else []), *conf.get("needs", [])]


def _stage(run_dir: Path, name: str, row: dict[str, Any], conf: dict[str, Any]) -> StageData:
    d = run_dir / name
    return StageData(name=name, status=row.get("status", "not-run" if conf.get("enabled", True) else "disabled"),
                     after=_after(name, conf), wall_s=row.get("wall_s"), summary=row, plan=_json(d / "plan.json"),
                     metrics=read_jsonl(d / "metrics.jsonl"), result=_json(d / "result.json"), config=conf)


def stage_depths(stages: list[StageData]) -> dict[str, int]:
    """Each stage's column in the graph: 0 for a stage that starts from the base model, else one more than the
    deepest stage it starts from or needs (among `stages`)."""
    by_name = {s.name: s for s in stages}
    depth: dict[str, int] = {}

    def visit(name: str, seen: tuple[str, ...] = ()) -> int:
        if name not in depth:
            ups = [u for u in by_name[name].after if u in by_name and u not in seen]
            depth[name] = 1 + max((visit(u, (*seen, name)) for u in ups), default=-1)
        return depth[name]

    for s in stages:
        visit(s.name)
    return depth


def read_sweeps(run_dir: Path) -> list[SweepData]:
    """The sweeps of this run's config: `<output_dir>/<name>-tune-<stage>/sweep_results.json` beside the run."""
    out = []
    for path in sorted(run_dir.parent.glob(f"{run_dir.name}-tune-*/sweep_results.json")):
        data = _json(path)
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            continue
        known = {"trial", "status", "predicted_peak_gib", "measured_peak_gib", "params", "predicted_run_s", "reason"}
        metric = next((k for r in data["rows"] for k in r if k not in known), None)
        out.append(SweepData(path.parent.name, metric, data["rows"], data.get("best")))
    return out


def _evaluation(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The run's evaluation: summary.json's entry under the evaluating stage's name (eval), else that stage's
    results.json in its directory (a run stopped before its summary was written)."""
    evaluator = run_evaluator()
    if evaluator is None:
        return None
    return summary.get(evaluator) or _json(run_dir / evaluator / "results.json")


def read_run(run_dir: str | Path) -> RunData:
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory")
    summary = _json(run_dir / "summary.json") or {}
    manifest = _json(run_dir / "manifest.json") or {}
    config = _json(run_dir / "config.resolved.json") or manifest.get("run", {}).get("config") or {}
    if not summary and not config:
        raise FileNotFoundError(f"{run_dir}: not a medgpt-ray run directory (no summary.json, no "
                                f"config.resolved.json)")
    stage_confs: dict[str, Any] = config.get("stages", {})
    rows: dict[str, Any] = summary.get("stages", {})
    names = list(rows) + [s for s in stage_confs if s not in rows]
    stages = [_stage(run_dir, s, rows.get(s, {}), stage_confs.get(s, {})) for s in names]
    order = list(STAGE_KINDS)
    depth = stage_depths(stages)  # summary.json's keys are sorted: the graph's order instead
    stages.sort(key=lambda s: (depth[s.name], order.index(s.name) if s.name in order else len(order)))
    run_info = {k: v for k, v in manifest.get("run", {}).items() if k != "config"}
    return RunData(run_dir, summary.get("name") or config.get("name") or run_dir.name, summary.get("wall_s"),
                   stages, run_info, _json(run_dir / "clean" / "report.json"),
                   _json(run_dir / "data" / PREPARED_FILE), read_sweeps(run_dir),
                   _evaluation(run_dir, summary))


_POSITION = re.compile(r"\s*\((?:column|line|char)[^)]*\)")
_TURN = re.compile(r"^turn \d+: ")


def reason_label(reason: str) -> str:
    """A quarantine reason as the report counts it: positions dropped so that reasons of one kind group
    together ("invalid JSON: Expecting value (column 88)" -> "invalid JSON")."""
    reason = _TURN.sub("", _POSITION.sub("", reason))
    if reason.startswith("invalid JSON"):
        return "invalid JSON"
    return reason[:80]


def prepared_counts(prepared: dict[str, Any]) -> dict[str, Any]:
    """What data/prepared.json keeps of each kind's PreparedData: counts and quarantine reasons, no paths."""
    keys = ("source_records", "train_records", "eval_records", "quarantined", "redactions")
    return {kind: {**{k: getattr(d, k) for k in keys}, "reasons": quarantine_reasons(d.quarantine_file),
                   "files_not_read": dict(Counter(why for _, why in d.skipped_files))}
            for kind, d in prepared.items()}


def quarantine_reasons(path: str | Path | None) -> dict[str, int]:
    """Counts of the reasons in a quarantine file (only the `reason` field of each line is read)."""
    if not path:
        return {}
    return dict(Counter(reason_label(str(r.get("reason", "?"))) for r in read_jsonl(Path(path))).most_common())
