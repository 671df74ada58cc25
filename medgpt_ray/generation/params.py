"""How an answer is generated: its length limit, greedy or sampled decoding, how many samples, the seed."""

from __future__ import annotations

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
