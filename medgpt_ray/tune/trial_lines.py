"""One line per finished trial while a sweep runs. Tune's own console reporter is off by default (its tables
and banners drowned the sweep's lines), so this callback is what shows a sweep is moving."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray.tune import Callback


def _value(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


class TrialLines(Callback):
    def __init__(self, echo: Callable[[str], None], metric: str, total: int):
        self.echo, self.metric, self.total = echo, metric, total
        self.finished = 0

    def _line(self, trial: Any, failed: bool) -> None:
        self.finished += 1
        result = trial.last_result or {}
        params = ", ".join(f"{k}={_value(v)}" for k, v in sorted((trial.config or {}).items())
                           if not isinstance(v, dict))
        if failed:
            outcome = "failed (see the sweep's trial directory)"
        elif result.get("pruned"):
            outcome = f"pruned before launch ({result.get('reason', 'over budget')})"
        else:
            value = result.get(self.metric)
            shown = f"{self.metric} {value:.4f}" if isinstance(value, int | float) else f"no {self.metric}"
            outcome = shown + ("" if result.get("completed") else ", stopped early by the scheduler")
        self.echo(f"[tune] trial {self.finished}/{self.total} {params}: {outcome}")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._line(trial, failed=False)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._line(trial, failed=True)
