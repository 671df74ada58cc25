"""The eval stage's statistics, pure numpy: the win rate of one model over another on the same prompts, judged by
reward scores (ties count half), with a seeded bootstrap 95 % interval over the prompts; exam accuracy, overall and
per subject."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

TIE_TOLERANCE = 1e-6  # scores closer than this are a tie (the same answer scores the same)


def outcomes(candidate: Sequence[float], reference: Sequence[float], tol: float = TIE_TOLERANCE) -> np.ndarray:
    """Per prompt: 1 the candidate's answer scores higher, 0.5 a tie, 0 lower."""
    a, b = np.asarray(candidate, dtype=float), np.asarray(reference, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"scores of {a.shape} and {b.shape}: one score per prompt for both models")
    diff = a - b
    return np.where(np.abs(diff) <= tol, 0.5, (diff > 0).astype(float))


def bootstrap_interval(values: np.ndarray, resamples: int = 1000, seed: int = 0, level: float = 0.95
                       ) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of `values` (prompts resampled with replacement, seeded)."""
    if len(values) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values), size=(resamples, len(values)))
    means = values[picks].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def win_rate(candidate: Sequence[float], reference: Sequence[float], resamples: int = 1000, seed: int = 0,
             tol: float = TIE_TOLERANCE) -> dict[str, Any]:
    """wins/ties/losses of the candidate over the reference, the win rate (ties half) and its 95 % interval."""
    o = outcomes(candidate, reference, tol)
    lo, hi = bootstrap_interval(o, resamples, seed)
    n = len(o)
    return {"prompts": n, "wins": int((o == 1).sum()), "ties": int((o == 0.5).sum()), "losses": int((o == 0).sum()),
            "win_rate": round(float(o.mean()), 4) if n else None,
            "ci95": [round(lo, 4), round(hi, 4)] if n else None, "resamples": resamples}


def accuracy(correct: Sequence[bool]) -> float | None:
    return round(float(np.mean(correct)), 4) if len(correct) else None


NO_SUBJECT = "(none)"  # per_subject's group of the questions whose record names no subject


def exam_summary(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A model's exam block of results.json from its per-question items (id, answer, loglik, loglik_sum, generated,
    subject where the record names one): the accuracies, and per subject (sorted, NO_SUBJECT last) the questions,
    log-likelihood and generated-letter accuracy when any question has a subject."""
    out: dict[str, Any] = {"questions": len(items),
                           "loglik_accuracy": accuracy([x["loglik"] == x["answer"] for x in items]),
                           "loglik_sum_accuracy": accuracy([x["loglik_sum"] == x["answer"] for x in items]),
                           "generated_accuracy": accuracy([x["generated"] == x["answer"] for x in items]),
                           "unparsed": sum(not x["generated"] for x in items)}
    if any("subject" in x for x in items):
        groups: dict[str, list[dict[str, Any]]] = {}
        for x in items:
            groups.setdefault(x.get("subject", NO_SUBJECT), []).append(x)
        out["per_subject"] = {name: {"questions": len(g),
                                     "loglik_accuracy": accuracy([x["loglik"] == x["answer"] for x in g]),
                                     "generated_accuracy": accuracy([x["generated"] == x["answer"] for x in g])}
                              for name, g in sorted(groups.items(), key=lambda kv: (kv[0] == NO_SUBJECT, kv[0]))}
    return out
