"""Generations/s and generated tokens/s of an online-RL trainer's (GRPO's, RLOO's) own generate calls on this
worker, logged with TRL's metrics (TRL logs completion lengths, not rates)."""

from __future__ import annotations

import time
from typing import Any


class GenerationRate:
    def _generate(self, prompts: Any) -> Any:
        t0 = time.perf_counter()
        out = super()._generate(prompts)
        dt = max(time.perf_counter() - t0, 1e-9)
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["generation/generations_per_s"].append(len(out[1]) / dt)
        self._metrics[mode]["generation/tokens_per_s"].append(sum(len(ids) for ids in out[1]) / dt)
        return out
