"""How an answer is generated: its length limit, greedy or sampled decoding (sampler.py's settings), how many samples,
the seed."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from medgpt_ray.generation.sampler import Settings


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    num_samples: int = 1
    # A Generator's: torch's global generator seeded once, after loading. A served request's: its own generator
    # (sampler.py says what that guarantees); None: the server's global generator.
    seed: int | None = 0
    top_k: int = 0  # 0: no top-k
    repetition_penalty: float = 1.0  # 1: none
    # OpenAI's, for a served request on the slots (generate has no such processors: its engines refuse them)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None  # OpenAI's logprobs / top_logprobs: None off; k the likeliest k beside each token

    def __post_init__(self) -> None:
        # Refused here too, not only by the callers' parsers: transformers reads max_new_tokens 0 as "its default"
        # and a negative temperature or a top_p above 1 as nothing at all, so nonsense would run silently.
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens {self.max_new_tokens!r}: an integer >= 1 is required")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature {self.temperature!r}: a number >= 0 is required (0: greedy)")
        self.settings()  # the sampler's checks: top_p, top_k, the penalties, logit_bias
        if self.num_samples > 1 and self.temperature <= 0:
            raise ValueError(f"--num-samples {self.num_samples} with --temperature 0: greedy decoding gives every "
                             "sample the same answer; set a temperature > 0 (e.g. 0.7)")

    def generate_cannot(self) -> str | None:
        """The first of OpenAI's settings transformers' generate has no processor for, that this asks for (by its
        field name), or None: a path through generate refuses it rather than ignore it."""
        for name in ("presence_penalty", "frequency_penalty", "logit_bias"):
            if getattr(self, name):
                return name
        return "logprobs" if self.logprobs is not None else None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def settings(self) -> Settings:
        """The sampler's settings for one answer."""
        return Settings(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                        repetition_penalty=self.repetition_penalty, seed=self.seed,
                        presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                        logit_bias=self.logit_bias, logprobs=self.logprobs)

    def sampling(self) -> dict[str, Any]:
        """transformers' generate() arguments for the decoding: sampled above temperature 0, else greedy. Every one
        is given, so a model's own generation_config.json (Qwen's top_k 20, repetition_penalty 1.05) does not add
        settings the slots would not apply."""
        penalty = {"repetition_penalty": self.repetition_penalty}
        if self.temperature > 0:
            return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                    **penalty}
        return {"do_sample": False, **penalty}
