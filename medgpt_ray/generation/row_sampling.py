"""Sampling with each row's own settings: a batch of requests that asked for different temperatures and top_p (the
slot engine's decode step, generation/slot_engine.py). Row by row it is transformers' sampling: its
TemperatureLogitsWarper, then its TopPLogitsWarper (the smallest set of tokens whose probability reaches top_p, at
least one), then torch.multinomial's one-sample draw (an Exp(1) race, the same random numbers); a row at temperature
0 takes the argmax of its raw logits, as generate's greedy decoding does. No host read of a device value: the
decode loop queues it behind the step."""

from __future__ import annotations

from typing import Any


def sample_rows(logits: Any, temperature: Any, top_p: Any, any_top_p: bool = True) -> Any:
    """The next token of each row of `logits` ([rows, vocab], float32) for its `temperature` and `top_p` ([rows]
    each; temperature 0: greedy). `any_top_p` False (every top_p 1, as the caller knows from its requests) skips the
    sort."""
    import torch

    greedy = temperature <= 0
    scores = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    if any_top_p:
        ascending, order = torch.sort(scores, descending=False, dim=-1)
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - top_p)[:, None]
        drop[:, -1] = False  # the most likely token always stays (min_tokens_to_keep 1)
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    probs = scores.softmax(dim=-1)
    sampled = (probs / torch.empty_like(probs).exponential_(1)).argmax(dim=-1)
    return torch.where(greedy, logits.argmax(dim=-1), sampled)
