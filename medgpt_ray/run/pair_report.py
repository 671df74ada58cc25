"""A run's held-out preference accuracies beside the two baselines that read no model.

Every stage kind that ranks preference pairs says in its registry entry where its held-out accuracy is and what
ranks a pair (config.PairAccuracy: the reward model's score for rm, the implicit reward for dpo, the
length-normalised log-probability for orpo and simpo); a new kind plugs in there. The baselines
(data/preference_baselines.py: length only, a character-bigram perceptron over the answers) are fitted once per
run on the driver, on the run's prepared preference splits, so that summary.json and the summary table say how
much of a stage's accuracy the pairs give away on their own. No record text is printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from medgpt_ray.config import PipelineConfig, stage_kind
from medgpt_ray.data.preference_baselines import preference_baselines
from medgpt_ray.stages.outputs import HELD_OUT

KIND = "preference"


def pair_stages(cfg: PipelineConfig) -> list[str]:
    """The enabled stages that rank preference pairs, in pipeline order."""
    return [s for s in cfg.enabled_stages() if stage_kind(s).pair_accuracy is not None]


def run_baselines(cfg: PipelineConfig, data_dir: Path, prepared: dict[str, Any]) -> dict[str, Any] | None:
    """The baselines on this run's preference splits (`prepared[KIND]`, else the splits an earlier run of it left
    in `data_dir` when every stage is skipped); None when no enabled stage ranks pairs or there is no split."""
    if not pair_stages(cfg):
        return None
    d = prepared.get(KIND)
    train, held_out = ((Path(d.train_file), Path(d.eval_file)) if d is not None else
                       (data_dir / f"{KIND}.train.parquet", data_dir / f"{KIND}.eval.parquet"))
    if not (train.is_file() and held_out.is_file()):
        return None
    return preference_baselines(train, held_out)


def summary_fields(cfg: PipelineConfig, stages: dict[str, dict[str, Any]],
                   baselines: dict[str, Any] | None) -> dict[str, Any]:
    """summary.json's `baselines` ({length, bigram_perceptron}: held-out accuracies), `baselines_detail` (their
    rules, train accuracies and pair counts) and `preference_accuracy` (per stage that has one: its accuracy,
    what ranked the pairs, and its margin over the better baseline)."""
    if baselines is None:
        return {}
    base = {"length": baselines["length"]["accuracy"], "bigram_perceptron": baselines["bigram_perceptron"]["accuracy"]}
    known = [v for v in base.values() if v is not None]
    accuracy = {}
    for s in pair_stages(cfg):
        pa = stage_kind(s).pair_accuracy
        value = (stages.get(s, {}).get(HELD_OUT) or {}).get(pa.key)
        if isinstance(value, float | int):
            accuracy[s] = {"accuracy": value, "scored_by": pa.scorer,
                           "over_baselines": value - max(known) if known else None}
    return {"baselines": base, "baselines_detail": baselines, "preference_accuracy": accuracy}


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def format_pair_line(summary: dict[str, Any]) -> str | None:
    """One line: each stage's held-out preference accuracy, then the two baselines (None without baselines)."""
    base = summary.get("baselines")
    if not base:
        return None
    n = (summary.get("baselines_detail") or {}).get("eval_pairs")
    stages = ", ".join(f"{s} {_fmt(a['accuracy'])} ({a['scored_by']})"
                       for s, a in (summary.get("preference_accuracy") or {}).items())
    return (f"held-out preference accuracy on {n} pairs: {stages or 'no stage scored yet'}; baselines without a "
            f"model: length {_fmt(base['length'])}, bigram perceptron {_fmt(base['bigram_perceptron'])}")
