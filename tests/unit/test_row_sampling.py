"""Sampling with each row's own temperature and top_p (generation/row_sampling.py) is transformers' sampling row by
row: its temperature and top-p warpers, then torch.multinomial's draw under the same seed; temperature 0 is the
argmax."""

from __future__ import annotations

import torch

from medgpt_ray.generation.row_sampling import sample_rows


def hf_draw(logits: torch.Tensor, temperature: float, top_p: float) -> int:
    """One row as generate samples it: TemperatureLogitsWarper, TopPLogitsWarper (where top_p < 1), multinomial."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    scores = TemperatureLogitsWarper(temperature)(None, logits[None])
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return int(torch.multinomial(scores.softmax(dim=-1), num_samples=1))


def test_each_row_samples_as_transformers_would_with_its_own_settings():
    torch.manual_seed(0)
    logits = torch.randn(4, 500) * 4
    settings = [(0.7, 0.9), (1.3, 1.0), (0.0, 1.0), (1.0, 0.5)]
    temperature = torch.tensor([t for t, _ in settings])
    top_p = torch.tensor([p for _, p in settings])
    for seed in range(20):
        torch.manual_seed(seed)
        ours = sample_rows(logits, temperature, top_p).tolist()
        for row, (t, p) in enumerate(settings):
            if t == 0:
                assert ours[row] == int(logits[row].argmax())
                continue
            # The same draw, alone: the row's random numbers are its part of the batch's (Exp(1) per logit).
            torch.manual_seed(seed)
            race = torch.empty_like(logits).exponential_(1)[row]
            scores = logits[row] / t
            if p < 1:
                from transformers import TopPLogitsWarper

                scores = TopPLogitsWarper(p)(None, scores[None])[0]
            assert ours[row] == int((scores.softmax(-1) / race).argmax())


def test_one_row_draws_what_multinomial_draws_under_the_same_seed():
    torch.manual_seed(1)
    logits = torch.randn(1, 300) * 3
    for seed in range(20):
        for t, p in [(0.8, 0.95), (1.0, 1.0), (0.5, 0.3)]:
            torch.manual_seed(seed)
            ours = int(sample_rows(logits, torch.tensor([t]), torch.tensor([p]), any_top_p=p < 1)[0])
            torch.manual_seed(seed)
            assert ours == hf_draw(logits[0], t, p)


def test_top_p_narrows_the_choice():
    torch.manual_seed(2)
    logits = torch.randn(1, 1000)
    narrow = {int(sample_rows(logits, torch.tensor([1.0]), torch.tensor([0.05]))[0]) for _ in range(50)}
    wide = {int(sample_rows(logits, torch.tensor([1.0]), torch.tensor([1.0]))[0]) for _ in range(50)}
    kept = top_p_kept(logits[0], 0.05)
    assert narrow <= kept and len(wide) > len(narrow)


def top_p_kept(logits: torch.Tensor, top_p: float) -> set[int]:
    from transformers import TopPLogitsWarper

    scores = TopPLogitsWarper(top_p)(None, logits[None])[0]
    return set(torch.nonzero(torch.isfinite(scores)).flatten().tolist())
