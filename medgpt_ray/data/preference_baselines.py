"""Two baselines for held-out preference accuracy that read no model, so that a stage's accuracy can be judged
against what the pairs give away on their own.

- **length**: ranks the longer answer first, or the shorter: whichever of the two rules is right more often on
  the train split (a tie goes to "longer") is applied to the held-out split. It reads the character count of
  each answer string, nothing else.
- **bigram perceptron**: a linear scorer over the character bigrams of the answer string (counts, the answer
  alone: no prompt, no template), trained pairwise on the train split (an averaged perceptron, update when
  w·(f(chosen) − f(rejected)) ≤ 0, a fixed number of passes in a seeded order) and scored on the held-out split.
  Prompt bigrams would add nothing: chosen and rejected share the prompt, so its features cancel in the pairwise
  difference. A linear model over the answer therefore sees only what answers give away by themselves (words or
  drugs that are always chosen, a vague style that is always rejected); it cannot learn that an answer is right
  for one question and wrong for another.

Accuracy is the share of held-out pairs scored chosen-first, a tie counting one half (what a coin toss scores);
None when there are no held-out pairs.
Pure Python over the canonical preference records (`{"conversations", "chosen", "rejected"}`, data/kinds.py);
deterministic.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from medgpt_ray.data.shards import ROW_GROUP, num_rows, read_records

PASSES = 5
SEED = 0
# The perceptron keeps every training pair's bigram difference in memory: on a large corpus it learns from the
# first this many train pairs, a uniform sample since the split is in hash order.
MAX_TRAIN_PAIRS = 20_000

Pair = tuple[str, str]  # (chosen, rejected)


def _credit(a: float, b: float) -> float:
    """1 when a ranks above b, one half on a tie, else 0."""
    return 1.0 if a > b else 0.5 if a == b else 0.0


def _mean(credits: list[float]) -> float | None:
    """The share of pairs ranked right; None when there are no pairs (an accuracy of nothing is not 0)."""
    return sum(credits) / len(credits) if credits else None


def length_rule(train: Iterable[Pair]) -> tuple[str, float]:
    """("longer" or "shorter", its train accuracy): the length rule that ranks more train pairs right."""
    longer = _mean([_credit(len(c), len(r)) for c, r in train])
    if longer is None:
        longer = 0.5
    return ("longer", longer) if longer >= 0.5 else ("shorter", 1.0 - longer)


def length_accuracy(pairs: Iterable[Pair], rule: str) -> float | None:
    sign = 1 if rule == "longer" else -1
    return _mean([_credit(sign * len(c), sign * len(r)) for c, r in pairs])


def bigrams(text: str) -> Counter:
    return Counter(text[i:i + 2] for i in range(len(text) - 1))


class BigramPerceptron:
    """Averaged pairwise perceptron over answer character bigrams (see the module docstring)."""

    def __init__(self) -> None:
        self.weights: dict[str, float] = {}

    def fit(self, train: list[Pair], passes: int = PASSES, seed: int = SEED) -> BigramPerceptron:
        diffs = []
        for chosen, rejected in train:
            d = bigrams(chosen)
            d.subtract(bigrams(rejected))
            diffs.append({k: v for k, v in d.items() if v})
        w: dict[str, float] = {}
        u: dict[str, float] = {}  # step-weighted sum of updates: w - u/steps is the average of w over all steps
        steps = 1
        order = list(range(len(diffs)))
        rng = random.Random(seed)
        for _ in range(passes):
            rng.shuffle(order)
            for i in order:
                d = diffs[i]
                if sum(w.get(k, 0.0) * v for k, v in d.items()) <= 0:
                    for k, v in d.items():
                        w[k] = w.get(k, 0.0) + v
                        u[k] = u.get(k, 0.0) + steps * v
                steps += 1
        self.weights = {k: w[k] - u[k] / steps for k in w if w[k] - u[k] / steps}
        return self

    def score(self, text: str) -> float:
        return sum(self.weights.get(k, 0.0) * v for k, v in bigrams(text).items())

    def accuracy(self, pairs: Iterable[Pair]) -> float | None:
        return _mean([_credit(self.score(c), self.score(r)) for c, r in pairs])


def baselines(train: list[Pair], held_out: list[Pair]) -> dict[str, Any]:
    """Both baselines fitted on `train` and scored on `held_out` (lists of (chosen, rejected) answer strings)."""
    rule, rule_train = length_rule(train)
    model = BigramPerceptron().fit(train)
    longer = sum(len(c) > len(r) for c, r in held_out)
    return {
        "train_pairs": len(train),
        "eval_pairs": len(held_out),
        "eval_chosen_longer": longer / len(held_out) if held_out else None,
        "length": {"rule": rule, "train_accuracy": rule_train, "accuracy": length_accuracy(held_out, rule)},
        "bigram_perceptron": {"train_accuracy": model.accuracy(train), "accuracy": model.accuracy(held_out),
                              "features": len(model.weights), "passes": PASSES},
    }


def iter_pairs(path: str | Path, limit: int | None = None) -> Iterator[Pair]:
    """(chosen, rejected) of a prepared preference split, in file (hash) order, read a row group at a time."""
    n = num_rows(path) if limit is None else min(limit, num_rows(path))
    for start in range(0, n, ROW_GROUP):
        for record in read_records(path, start, min(start + ROW_GROUP, n)):
            yield record["chosen"], record["rejected"]


def preference_baselines(train_file: str | Path, eval_file: str | Path) -> dict[str, Any]:
    """The two baselines on a prepared preference split (data/prepare.py's `preference.train.parquet` and
    `preference.eval.parquet`): accuracies on the held-out pairs, and the counts they rest on."""
    return baselines(list(iter_pairs(train_file, MAX_TRAIN_PAIRS)), list(iter_pairs(eval_file)))
