"""`medgpt-ray serve --engine slots` (generation/slot_engine.py: continuous batching on a static cache's rows) on the
shared local Ray cluster with the tiny model: test_serve.py's client-facing tests, run again against a replica on
this engine (imported, so pytest runs them here with this module's endpoint): whole and streamed answers agree,
concurrent streaming clients are batched and a slow reader stalls nobody, a request past its deadline and a dropped
stream stop their generation (the replica's CPU idle after); and the responses name the engine."""

from __future__ import annotations

from dataclasses import replace

import pytest

from medgpt_ray.infer.serve import ServeOptions, serve_model
from medgpt_ray.infer.source import ModelSource
from tests.ray.test_serve import (  # noqa: F401  (fixtures and tests pytest collects here)
    KEY,
    LIMITS,
    USER,
    client,
    replica,
    test_a_client_that_drops_its_stream_stops_the_generation,
    test_a_request_past_its_deadline_is_stopped,
    test_a_stop_string_ends_the_answer_before_it_whole_and_streamed,
    test_concurrent_streams_are_batched_and_a_slow_reader_stalls_nobody,
    test_whole_and_streamed_answers_agree,
)
from tests.ray_startup import free_port

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def endpoint(ray_cluster, tiny_model):
    from ray import serve

    url = serve_model(ModelSource(tiny_model, "chatml", "sft"),
                      ServeOptions(port=free_port(), api_key=KEY, cpus_per_replica=0.5, engine="slots",
                                   limits=replace(LIMITS, max_concurrent=8)))
    yield url
    serve.shutdown()


def test_the_responses_name_the_slot_engine(endpoint, replica):  # noqa: F811
    reply = client(endpoint).chat.completions.create(model="sft", messages=USER, max_tokens=4)
    assert "continuous batching on static-cache slots: up to 8 requests at once" in reply.system_fingerprint


def test_a_seed_gives_the_same_answer_and_each_choice_its_own(endpoint, replica):  # noqa: F811
    """OpenAI's `seed` on the slots: the same seed, the same sampled answer; n choices differ (choice i is sampled
    with seed + i); another seed, another answer."""
    ask = client(endpoint).chat.completions.create

    def answers(seed: int, n: int = 1) -> list[str]:
        reply = ask(model="sft", messages=USER, max_tokens=8, temperature=2.0, seed=seed, n=n,
                     extra_body={"top_k": 0, "repetition_penalty": 1.1})
        return [c.message.content for c in reply.choices]

    first = answers(11)
    assert answers(11) == first
    pair = answers(11, n=2)
    assert pair[0] == first[0] and pair[1] != pair[0]
    assert answers(12) != first


def test_logit_bias_and_the_penalties_are_honoured_on_the_slots(endpoint, replica, tiny_model):  # noqa: F811
    """logit_bias +100 on one token: every greedy token of the answer is that token. With frequency_penalty 2 too,
    each time it is drawn costs it 2: after about 50 of them (100 over the spread of the tiny model's logits) other
    tokens win, so a 64-token answer holds it 40 to 63 times (the arithmetic itself: tests/unit/test_sampler.py).
    A token id past the model's logits is a 400 naming logit_bias."""
    import openai

    from medgpt_ray.models import load_tokenizer

    tok = load_tokenizer(tiny_model)
    token = tok.convert_tokens_to_ids(tok.tokenize("病")[0])
    ask = client(endpoint).chat.completions.create

    def ids(**kw) -> list[int]:
        reply = ask(model="sft", messages=USER, max_tokens=64, logit_bias={str(token): 100}, **kw)
        assert reply.usage.completion_tokens == 64
        return tok(reply.choices[0].message.content, add_special_tokens=False)["input_ids"]

    assert ids() == [token] * 64
    assert 40 <= ids(frequency_penalty=2.0).count(token) < 64
    with pytest.raises(openai.BadRequestError) as e:
        ask(model="sft", messages=USER, max_tokens=2, logit_bias={str(len(tok) + 10**6): 5})
    assert e.value.param == "logit_bias"


def test_logprobs_whole_and_streamed(endpoint, replica, tiny_model):  # noqa: F811
    """OpenAI's logprobs on the slots, through the openai client: one entry per completion token, each a
    log-probability with top_logprobs likeliest sorted beside it; greedy, the chosen token is the likeliest; the
    streamed chunks carry the same entries as the whole answer."""
    from medgpt_ray.models import load_tokenizer

    tok = load_tokenizer(tiny_model)
    ask = client(endpoint).chat.completions.create
    whole = ask(model="sft", messages=USER, max_tokens=12, logprobs=True, top_logprobs=3)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 12
    for entry in content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and all(v <= 0 for v in tops)
        assert entry.token == entry.top_logprobs[0].token and entry.logprob == tops[0]  # greedy: the argmax
        assert sum(2.718281828 ** v for v in tops) <= 1 + 1e-6
    assert "".join(e.token for e in content) == tok.decode(tok(whole.choices[0].message.content,
                                                             add_special_tokens=False)["input_ids"])
    streamed = [e for chunk in ask(model="sft", messages=USER, max_tokens=12, logprobs=True, top_logprobs=3,
                                   stream=True)
                for c in chunk.choices if c.logprobs for e in c.logprobs.content]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in content]
    plain = ask(model="sft", messages=USER, max_tokens=4)
    assert plain.choices[0].logprobs is None
