"""How an answer is generated: its length limit, greedy or sampled decoding, how many samples, the seed."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    num_samples: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        # Refused here too, not only by the callers' parsers: transformers reads max_new_tokens 0 as "its default"
        # and a negative temperature or a top_p above 1 as nothing at all, so nonsense would run silently.
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens {self.max_new_tokens!r}: an integer >= 1 is required")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature {self.temperature!r}: a number >= 0 is required (0: greedy)")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p {self.top_p!r}: a number in (0, 1] is required")
        if self.num_samples > 1 and self.temperature <= 0:
            raise ValueError(f"--num-samples {self.num_samples} with --temperature 0: greedy decoding gives every "
                             "sample the same answer; set a temperature > 0 (e.g. 0.7)")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sampling(self) -> dict[str, Any]:
        """transformers' generate() arguments for the decoding: sampled above temperature 0, else greedy."""
        if self.temperature > 0:
            return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p}
        return {"do_sample": False}
