"""The one sampler (generation/sampler.py) is transformers' sampling row by row: its repetition penalty, min-new-tokens
hold, temperature, top-k, top-p and min-p processors, then torch.multinomial's draw under the same seed; temperature 0
is the argmax; a row with its own seed draws the same tokens whatever else runs beside it."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from medgpt_ray.generation.sampler import Sampler, Settings, from_processors, held_back

VOCAB = 300


def hf_scores(history: torch.Tensor, logits: torch.Tensor, s: Settings) -> torch.Tensor:
    """One row's scores as generate's processors leave them for these settings."""
    scores = logits[None]
    if s.repetition_penalty != 1:
        scores = RepetitionPenaltyLogitsProcessor(s.repetition_penalty)(history[None], scores)
    if not s.sampled:
        return scores[0]
    for warper in [TemperatureLogitsWarper(s.temperature), s.top_k and TopKLogitsWarper(s.top_k),
                   s.top_p < 1 and TopPLogitsWarper(s.top_p), s.min_p and MinPLogitsWarper(s.min_p)]:
        if warper:
            scores = warper(history[None], scores)
    return scores[0]


SETTINGS = [Settings(0.7, 0.9), Settings(1.3, 1.0, top_k=5), Settings(0.0, repetition_penalty=1.5),
            Settings(1.0, 0.5, min_p=0.1, repetition_penalty=1.2), Settings(0.9, top_k=40, top_p=0.8)]


def test_each_row_samples_as_generate_would_with_its_own_settings():
    torch.manual_seed(0)
    logits = torch.randn(len(SETTINGS), VOCAB) * 4
    history = torch.randint(0, VOCAB, (len(SETTINGS), 12))
    for seed in range(20):
        sampler = Sampler(len(SETTINGS), VOCAB, "cpu")
        sampler.take(list(range(len(SETTINGS))), SETTINGS, history)
        torch.manual_seed(seed)
        ours = sampler.draw(logits.clone()).tolist()
        torch.manual_seed(seed)  # the batch's random numbers: one Exp(1) per logit, each row its part
        race = torch.empty_like(logits).exponential_(1)
        for row, s in enumerate(SETTINGS):
            scores = hf_scores(history[row], logits[row], s)
            expected = scores.argmax() if not s.sampled else (scores.softmax(-1) / race[row]).argmax()
            assert ours[row] == int(expected), (row, s)


@pytest.mark.parametrize("s", SETTINGS[:2] + SETTINGS[3:], ids=str)
def test_one_row_draws_what_multinomial_draws_under_the_same_seed(s):
    torch.manual_seed(1)
    logits = torch.randn(1, VOCAB) * 3
    history = torch.randint(0, VOCAB, (1, 8))
    for seed in range(10):
        sampler = Sampler(1, VOCAB, "cpu")
        sampler.take([0], [s], history)
        torch.manual_seed(seed)
        ours = int(sampler.draw(logits.clone())[0])
        torch.manual_seed(seed)
        assert ours == int(torch.multinomial(hf_scores(history[0], logits[0], s).softmax(-1), 1))


def test_the_penalty_counts_what_the_row_drew():
    """Greedy with a strong penalty: the token drawn first is penalised at the next step, as generate's processor
    would see it in input_ids."""
    logits = torch.zeros(1, VOCAB)
    logits[0, 7], logits[0, 9] = 5.0, 4.0
    sampler = Sampler(1, VOCAB, "cpu")
    sampler.take([0], [Settings(repetition_penalty=2.0)], torch.tensor([[1, 2]]))
    assert [int(sampler.draw(logits.clone())[0]) for _ in range(2)] == [7, 9]


def test_openai_penalties_count_the_answer_and_logit_bias_moves_the_logits():
    """frequency_penalty x count + presence_penalty, subtracted from the logits of the tokens the answer holds (not
    the prompt's), and logit_bias added: greedy steps whose argmax follows the arithmetic, per row."""
    logits = torch.zeros(3, VOCAB)
    logits[:, 7], logits[:, 9], logits[:, 11] = 5.0, 4.2, 3.0
    sampler = Sampler(3, VOCAB, "cpu")
    sampler.take([0, 1, 2], [Settings(frequency_penalty=0.5), Settings(presence_penalty=1.0),
                             Settings(logit_bias=((11, 2.5), (7, -100.0)))], torch.tensor([[9, 9]] * 3))
    drawn = [sampler.draw(logits.clone()).tolist() for _ in range(4)]
    # row 0: 7 (5.0), 7 (4.5 > 4.2), 9 (7 at 4.0 < 4.2), 7 (4.0 > 9's 3.7); the prompt's 9s count for nothing
    assert [d[0] for d in drawn] == [7, 7, 9, 7]
    # row 1: 7 once, then 9 (4.2 > 7's 4.0), then 7 and 9 both penalised once: 7 (4.0 > 3.2)
    assert [d[1] for d in drawn] == [7, 9, 7, 7]
    assert [d[2] for d in drawn] == [11] * 4  # 3.0 + 2.5 over 9's 4.2; 7 banned
    sampler.take([0], [Settings(frequency_penalty=0.5)])  # a new request: its counts start at zero
    assert int(sampler.draw(logits.clone(), rows=[0])[0]) == 7
    with pytest.raises(ValueError, match="past the model's"):
        sampler.take([1], [Settings(logit_bias=((VOCAB, 1.0),))])


def test_logprobs_are_the_models_own_distribution_for_the_rows_that_ask():
    """The drawn token's log-softmax of the raw logits (before bias and penalties) and the k likeliest, for the rows
    that ask; a draw where none asks keeps none."""
    logits = torch.randn(2, VOCAB)
    sampler = Sampler(2, VOCAB, "cpu")
    sampler.take([0, 1], [Settings(logprobs=3, logit_bias=((5, 100.0),)), Settings()])
    token = sampler.draw(logits.clone())
    assert int(token[0]) == 5  # the bias decided the draw...
    chosen, values, ids = sampler.last_logprobs
    want = logits.log_softmax(-1)
    assert float(chosen[0]) == pytest.approx(float(want[0, 5]))  # ...not the log-probability reported
    top = want[0].topk(3)
    torch.testing.assert_close(values[0], top.values)
    assert torch.equal(ids[0], top.indices)
    sampler.take([0], [Settings()])
    sampler.draw(logits.clone())
    assert sampler.last_logprobs is None


def test_stop_tokens_are_held_back_until_min_new_tokens():
    logits = torch.zeros(1, VOCAB)
    logits[0, 3] = 10.0  # the stop token, the argmax
    sampler = Sampler(1, VOCAB, "cpu", held=[3])
    sampler.take([0], [Settings(min_new_tokens=2)])
    assert [int(sampler.draw(logits.clone())[0]) for _ in range(3)][2] == 3
    sampler.take([0], [Settings(min_new_tokens=2)])
    assert 3 not in [int(sampler.draw(logits.clone())[0]) for _ in range(2)]


def test_a_seeded_row_draws_the_same_whatever_runs_beside_it():
    torch.manual_seed(3)
    logits = torch.randn(1, VOCAB).expand(4, VOCAB)  # the request's logits, in whichever row it takes
    seeded = Settings(1.0, seed=1234)

    def answer(row: int, neighbours: list[Settings], global_seed: int) -> list[int]:
        sampler = Sampler(4, VOCAB, "cpu")
        others = [r for r in range(4) if r != row]
        sampler.take(others[:len(neighbours)], neighbours)
        sampler.take([row], [seeded])
        torch.manual_seed(global_seed)
        return [int(sampler.draw(logits.clone())[row]) for _ in range(8)]

    alone = answer(0, [], 0)
    assert answer(2, [Settings(1.0), Settings(0.5, 0.9)], 99) == alone
    assert answer(1, [Settings(1.0, seed=5), Settings()], 7) == alone
    other_seed = Sampler(1, VOCAB, "cpu")
    other_seed.take([0], [Settings(1.0, seed=4321)])
    assert [int(other_seed.draw(logits[:1].clone())[0]) for _ in range(8)] != alone


def test_draw_of_some_rows_leaves_the_others_as_they_were():
    """The slot engine draws the first tokens of the rows it admits only: the rows in flight keep their count."""
    sampler = Sampler(3, VOCAB, "cpu", held=[3])
    sampler.take([0, 1, 2], [Settings(min_new_tokens=1, repetition_penalty=1.5)] * 3)
    logits = torch.zeros(2, VOCAB)
    logits[:, 3] = 10.0
    assert sampler.draw(logits.clone(), rows=[2, 0]).tolist() != [3, 3]
    assert sampler.produced.tolist() == [1, 0, 1]
    assert not sampler.seen[1].any()


def test_generate_processors_map_to_settings_and_others_are_named():
    processors = LogitsProcessorList([
        RepetitionPenaltyLogitsProcessor(1.1), MinNewTokensLengthLogitsProcessor(10, 4, [2, 5]),
        TemperatureLogitsWarper(0.6), TopKLogitsWarper(20), TopPLogitsWarper(0.8), MinPLogitsWarper(0.05)])
    settings, why = from_processors(processors, True, prompt_width=10)
    assert why == "" and settings == Settings(0.6, 0.8, 20, 0.05, 1.1, 4)
    assert held_back(processors) == [2, 5]
    assert from_processors(LogitsProcessorList([TopKLogitsWarper(20)]), False, 3)[0].temperature == 0.0
    settings, why = from_processors(LogitsProcessorList([NoRepeatNGramLogitsProcessor(3)]), True, 3)
    assert settings is None and "NoRepeatNGramLogitsProcessor" in why


def test_settings_refuse_nonsense():
    for bad in [{"top_k": -1}, {"repetition_penalty": 0.0}, {"top_p": 0.0}, {"min_p": 1.5}, {"temperature": -1},
                {"presence_penalty": 2.5}, {"frequency_penalty": -3.0}, {"logit_bias": ((1, 101.0),)},
                {"logprobs": 21}]:
        with pytest.raises(ValueError, match=next(iter(bad))):
            Settings(**bad)
