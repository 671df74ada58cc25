"""The one sampler: both decode loops of ours (the batch loop, decode_loop.py, and the slots, slot_engine.py) draw
every next token here, each row with its own settings. It is transformers' sampling, step for step, so a call is
answered as generate would answer it:
1. the repetition penalty (RepetitionPenaltyLogitsProcessor: a seen token's logit divided by the penalty, or
   multiplied where negative) and the stop tokens held back until min_new_tokens (MinNewTokensLengthLogitsProcessor);
   then OpenAI's own (generate has none of them; a served request's): `logit_bias` added to its tokens' logits, and
   `frequency_penalty` x the times a token was generated plus `presence_penalty` where it was, subtracted (counted
   over the answer, not the prompt, as OpenAI and vLLM count them);
2. a row at temperature 0 takes the argmax of that, as greedy generate does;
3. a sampled row: temperature, top-k, top-p, min-p (generate's warpers, in its order), then torch.multinomial's
   one-sample draw: probs / Exp(1), argmax (the same random numbers, without its host checks).
Nothing here reads a device value; the loops queue it behind the decode step.

Seeds. Rows without a seed of their own draw from torch's global generator in one call for the batch: a seeded
generate (torch.manual_seed, then generate) and the batch loop sample the same tokens. A row with a seed (a served
request's `seed`) draws from a torch.Generator of its own, seeded when the row is taken: the same seed gives the
request the same random numbers whatever else is in the batch. Its tokens are the same where its logits are; in a
batch shared with other requests a GPU's matrix products may differ in the last bits with the batch's shape, so a
near-tie can go the other way (on a CPU in float32, and alone on any device, they are the same)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# generate's logits processors the sampler stands in for, by class name: anything else generate would apply makes
# the batch loop hand the call back to generate (decode_loop.prepare says which).
TAKEN = {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper",
         "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "RepetitionPenaltyLogitsProcessor"}


MAX_LOGPROBS = 20  # OpenAI's most top_logprobs


@dataclass(frozen=True)
class Settings:
    """One row's sampling."""

    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0  # the stop tokens are held back until this many new tokens
    seed: int | None = None  # None: torch's global generator
    presence_penalty: float = 0.0  # OpenAI's: subtracted from the logit of every token the answer holds
    frequency_penalty: float = 0.0  # OpenAI's: x the times the answer holds the token, subtracted
    logit_bias: tuple[tuple[int, float], ...] = ()  # OpenAI's: (token id, added to its logit)
    logprobs: int | None = None  # OpenAI's: None off; k: each drawn token's log-probability and the k likeliest

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature {self.temperature!r}: a number >= 0 is required (0: greedy)")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p {self.top_p!r}: a number in (0, 1] is required")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k {self.top_k!r}: an integer >= 0 is required (0: off)")
        if not (math.isfinite(self.min_p) and 0 <= self.min_p <= 1):
            raise ValueError(f"min_p {self.min_p!r}: a number in [0, 1] is required")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty {self.repetition_penalty!r}: a number > 0 is required (1: off)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -2 <= value <= 2):
                raise ValueError(f"{name} {value!r}: a number in [-2, 2] is required (0: off)")
        if self.logprobs is not None and not (isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs {self.logprobs!r}: an integer in [0, {MAX_LOGPROBS}] is required")
        for token, bias in self.logit_bias:
            if not (math.isfinite(bias) and -100 <= bias <= 100) or token < 0:
                raise ValueError(f"logit_bias: token {token} bias {bias!r}: a token id >= 0 and a bias in [-100, 100]")

    @property
    def counts_answer(self) -> bool:
        """Whether the row needs its answer's token counts (a presence or frequency penalty)."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0

    @property
    def sampled(self) -> bool:
        return self.temperature > 0


def from_processors(processors: Any, do_sample: bool, prompt_width: int) -> tuple[Settings | None, str]:
    """The settings of generate's processor list for one call (the list `_get_logits_processor` built, so generate's
    defaults and the model's generation config are in it), or (None, why) where it holds something else."""
    if others := sorted({type(p).__name__ for p in processors} - TAKEN):
        return None, f"logits processors {others}"
    found: dict[str, Any] = {"temperature": 1.0 if do_sample else 0.0}
    for p in processors:
        name = type(p).__name__
        if getattr(p, "min_tokens_to_keep", 1) != 1:
            return None, f"{name} keeping {p.min_tokens_to_keep} tokens"
        if name == "TemperatureLogitsWarper":
            found["temperature"] = float(p.temperature)
        elif name == "TopKLogitsWarper":
            found["top_k"] = int(p.top_k)
        elif name == "TopPLogitsWarper":
            found["top_p"] = float(p.top_p)
        elif name == "MinPLogitsWarper":
            found["min_p"] = float(p.min_p)
        elif name == "RepetitionPenaltyLogitsProcessor":
            if isinstance(p.prompt_ignore_length, int):  # a tensor is the rows' left padding (5.24's generate)
                return None, "a repetition penalty that skips the prompt"
            found["repetition_penalty"] = float(p.penalty)
        elif name == "MinNewTokensLengthLogitsProcessor":
            found["min_new_tokens"] = max(found.get("min_new_tokens", 0),
                                          p.min_new_tokens + p.prompt_length_to_skip - prompt_width)
        else:  # MinLengthLogitsProcessor: a length counted with the prompt
            found["min_new_tokens"] = max(found.get("min_new_tokens", 0), p.min_length - prompt_width)
    return Settings(**found), ""


def penalty_skips_padding(processors: Any) -> bool:
    """Whether generate's repetition penalty leaves the rows' left padding out of what they have seen (transformers
    5.24 gives it the padding lengths; older versions count the padding)."""
    return any(type(p).__name__ == "RepetitionPenaltyLogitsProcessor" and p.prompt_ignore_length is not None
               for p in processors)


def held_back(processors: Any) -> list[int]:
    """The token ids generate's min-length processors hold back (their own stop ids)."""
    ids: set[int] = set()
    for p in processors:
        if type(p).__name__ in ("MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor"):
            ids.update(int(t) for t in p.eos_token_id.flatten().tolist())
    return sorted(ids)


class Sampler:
    """`rows` rows' settings as device tensors, and the tokens each row has seen (for a repetition penalty): `take`
    gives rows their settings and history when a request takes them, `draw` returns every row's next token and
    counts it as seen."""

    def __init__(self, rows: int, vocab: int, device: Any, held: list[int] | None = None):
        import torch

        self.rows, self.vocab, self.device = rows, vocab, device
        self.temperature = torch.zeros(rows, device=device)
        self.top_p = torch.ones(rows, device=device)
        self.top_k = torch.zeros(rows, dtype=torch.long, device=device)
        self.min_p = torch.zeros(rows, device=device)
        self.penalty = torch.ones(rows, device=device)
        self.min_new = torch.zeros(rows, dtype=torch.long, device=device)
        self.produced = torch.zeros(rows, dtype=torch.long, device=device)
        self.held = torch.tensor(held or [], dtype=torch.long, device=device)
        self.seen: Any = None  # [rows, vocab] bool, made when a row first asks for a repetition penalty
        self.counts: Any = None  # [rows, vocab] float: the answer's tokens, made when a row first asks for a
        # presence or frequency penalty
        self.bias: Any = None  # [rows, vocab] float, made when a row first asks for a logit_bias
        self.presence = torch.zeros(rows, device=device)
        self.frequency = torch.zeros(rows, device=device)
        self.generators: dict[int, Any] = {}
        self.settings: dict[int, Settings] = {}  # the host's copy: which steps a draw needs, read without the GPU
        # The last draw's (chosen log-probability [n], top values [n, k], top ids [n, k]) of the model's own
        # distribution (log-softmax of the logits, before penalties and temperature), where a row asked; else None.
        self.last_logprobs: Any = None

    def take(self, rows: list[int], settings: list[Settings], history: Any = None) -> None:
        """Rows `rows` start a request each with `settings`; `history` (a [len(rows), width] tensor of token ids, a
        list of each row's ids, or None) is what they have seen so far (the prompt; generate's repetition penalty
        counts a batch's left padding too)."""
        import torch

        index = torch.tensor(rows, dtype=torch.long, device=self.device)

        def put(tensor: Any, values: list) -> None:
            tensor[index] = torch.tensor(values, dtype=tensor.dtype, device=self.device)

        put(self.temperature, [s.temperature for s in settings])
        put(self.top_p, [s.top_p for s in settings])
        put(self.top_k, [s.top_k for s in settings])
        put(self.min_p, [s.min_p for s in settings])
        put(self.penalty, [s.repetition_penalty for s in settings])
        put(self.min_new, [s.min_new_tokens for s in settings])
        put(self.presence, [s.presence_penalty for s in settings])
        put(self.frequency, [s.frequency_penalty for s in settings])
        self.produced[index] = 0
        for row, s in zip(rows, settings, strict=True):
            self.settings[row] = s
            self.generators.pop(row, None)
            if s.seed is not None and s.sampled:
                self.generators[row] = torch.Generator(device=self.device).manual_seed(s.seed)
        if any(s.repetition_penalty != 1 for s in settings) and self.seen is None:
            self.seen = torch.zeros(self.rows, self.vocab, dtype=torch.bool, device=self.device)
        if any(s.counts_answer for s in settings) and self.counts is None:
            self.counts = torch.zeros(self.rows, self.vocab, device=self.device)
        if self.counts is not None:
            self.counts[index] = 0
        if any(s.logit_bias for s in settings) and self.bias is None:
            self.bias = torch.zeros(self.rows, self.vocab, device=self.device)
        if self.bias is not None:
            self.bias[index] = 0
            for row, s in zip(rows, settings, strict=True):
                for token, bias in s.logit_bias:
                    if token >= self.vocab:
                        raise ValueError(f"logit_bias: token {token} is past the model's {self.vocab} logits")
                    self.bias[row, token] = bias
        if self.seen is not None:
            self.seen[index] = False
            if isinstance(history, torch.Tensor):
                self.seen[index[:, None], history.to(self.device)] = True
            elif history is not None:
                for row, ids in zip(rows, history, strict=True):
                    self.seen[row, torch.as_tensor(ids, dtype=torch.long, device=self.device)] = True

    def free(self, row: int) -> None:
        """Row `row` holds no request any more: it is sampled greedily, from nothing it saw before."""
        self.take([row], [Settings()])
        self.settings.pop(row)

    def _any(self, test: Any, rows: list[int] | None = None) -> bool:
        return any(test(s) for row, s in self.settings.items() if rows is None or row in rows)

    def draw(self, logits: Any, bad: Any = None, rows: list[int] | None = None) -> Any:
        """The next token of every row (or of `rows`, in this order) from `logits` ([rows, vocab], float32, not
        kept); `bad` (a device flag, or None) turns true on probabilities that are not finite or negative, as
        torch.multinomial would refuse them."""
        import torch

        index = torch.arange(self.rows, device=self.device) if rows is None else \
            torch.tensor(rows, dtype=torch.long, device=self.device)

        def of(tensor: Any) -> Any:
            return tensor if rows is None else tensor[index]

        scores = logits
        if self._any(lambda s: s.repetition_penalty != 1, rows):
            penalty = of(self.penalty)[:, None]
            scores = torch.where(of(self.seen), torch.where(scores < 0, scores * penalty, scores / penalty), scores)
        if self._any(lambda s: bool(s.logit_bias), rows):
            scores = scores + of(self.bias)
        if self._any(lambda s: s.counts_answer, rows):
            counts = of(self.counts)
            scores = scores - of(self.frequency)[:, None] * counts - of(self.presence)[:, None] * (counts > 0)
        if self.held.numel() and self._any(lambda s: s.min_new_tokens > 0, rows):
            early = (of(self.produced) < of(self.min_new))[:, None] & torch.isin(
                torch.arange(scores.shape[-1], device=scores.device), self.held)[None]
            scores = scores.masked_fill(early, float("-inf"))
        token = torch.argmax(scores, dim=-1)
        if self._any(lambda s: s.sampled, rows):
            temperature = of(self.temperature)
            generators = [(i, self.generators[row]) for i, row in enumerate(rows or range(self.rows))
                          if row in self.generators]
            sampled = self._sample(scores, temperature, of(self.top_k), of(self.top_p), of(self.min_p), generators,
                                   rows, bad)
            token = torch.where(temperature > 0, sampled, token)
        self.last_logprobs = self._logprobs(logits, token, rows)
        self.produced[index] += 1
        if self.seen is not None:
            self.seen[index, token] = True
        if self.counts is not None:
            self.counts[index, token] += 1
        return token

    def _logprobs(self, logits: Any, token: Any, rows: list[int] | None) -> Any:
        asked = [s.logprobs for row, s in self.settings.items() if (rows is None or row in rows)
                 and s.logprobs is not None]
        if not asked:
            return None
        logprobs = logits.float().log_softmax(dim=-1)
        top = logprobs.topk(max(max(asked), 1), dim=-1)
        return logprobs.gather(1, token[:, None])[:, 0], top.values, top.indices

    def _sample(self, scores: Any, temperature: Any, top_k: Any, top_p: Any, min_p: Any, generators: list,
                rows: list[int] | None, bad: Any) -> Any:
        import torch

        scores = scores / torch.where(temperature > 0, temperature, torch.ones_like(temperature))[:, None]
        if self._any(lambda s: s.sampled and s.top_k > 0, rows):
            k = min(max(s.top_k for s in self.settings.values()), scores.shape[-1])
            kth = torch.topk(scores, k, dim=-1).values.gather(1, (top_k.clamp(1, k) - 1)[:, None])
            scores = scores.masked_fill((top_k[:, None] > 0) & (scores < kth), float("-inf"))
        if self._any(lambda s: s.sampled and s.top_p < 1, rows):
            ascending, order = torch.sort(scores, descending=False, dim=-1)
            drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)[:, None]
            drop[:, -1] = False  # the most likely token always stays (min_tokens_to_keep 1)
            scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        if self._any(lambda s: s.sampled and s.min_p > 0, rows):
            probs = scores.softmax(dim=-1)
            drop = probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True)
            drop.scatter_(1, probs.argmax(dim=-1, keepdim=True), False)
            scores = scores.masked_fill(drop, float("-inf"))
        probs = scores.softmax(dim=-1)
        if bad is not None:
            bad |= ((temperature > 0)[:, None] & ~(torch.isfinite(probs) & (probs >= 0))).any()
        race = torch.empty_like(probs).exponential_(1)
        for i, generator in generators:
            race[i].exponential_(1, generator=generator)
        return (probs / race).argmax(dim=-1)
