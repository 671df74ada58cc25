"""The generation engine (medgpt_ray/generation/, Ray-free: tests/unit/test_import_rules.py) in a plain process on
the tiny model: a batch's greedy answer to a prompt is the answer streamed for it (text, token counts, whether it
stopped by itself), and sampled answers depend on the seed alone."""

from __future__ import annotations

import json

import pytest

from medgpt_ray.generation.engine import Generator
from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.generation.stream import StreamedAnswer

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/stages/conftest.py

TURNS = [{"role": "system", "content": "你是医生"}, {"role": "user", "content": "发烧了需要吃什么药？"}]
BATCH = {"prompt_id": ["p", 7], "conversations": [json.dumps(TURNS), json.dumps(TURNS[1:])], "tools": ["[]", "[]"]}


def test_a_batch_answer_is_the_streamed_answer(tiny_model):
    gen = Generator(str(tiny_model), "chatml", {"max_new_tokens": 10})
    rows = gen({k: v[:1] for k, v in BATCH.items()})
    streamed = StreamedAnswer(gen, TURNS, None, GenerationParams(max_new_tokens=10))
    text = "".join(streamed)
    assert rows["prompt_id"] == ["p"] and rows["sample"] == [0] and 0 < rows["new_tokens"][0] <= 10
    assert [text, streamed.prompt_tokens, streamed.new_tokens, streamed.finished] == \
        [rows["response"][0], rows["prompt_tokens"][0], rows["new_tokens"][0], rows["finished"][0]]


def test_the_streamed_answer_reads_the_same_on_an_event_loop(tiny_model):
    """pieces(): how `serve` reads it where the model cannot batch continuously (infer/serve.py)."""
    import asyncio

    gen = Generator(str(tiny_model), "chatml", {"max_new_tokens": 10})
    params = GenerationParams(max_new_tokens=10)

    async def read() -> str:
        return "".join([p async for p in StreamedAnswer(gen, TURNS, None, params).pieces()])

    assert asyncio.run(read()) == "".join(StreamedAnswer(gen, TURNS, None, params))


def test_sampled_answers_follow_the_seed(tiny_model):
    def answers(seed: int) -> dict[str, list]:
        params = GenerationParams(max_new_tokens=8, temperature=1.0, num_samples=2, seed=seed)
        out = Generator(str(tiny_model), "chatml", params.as_dict())(BATCH)
        assert out["prompt_id"] == ["p", "p", "7", "7"] and out["sample"] == [0, 1, 0, 1]
        assert out["batch_seconds"][0] > 0 and out["batch_seconds"][1:] == [0.0, 0.0, 0.0]
        return {k: v for k, v in out.items() if k != "batch_seconds"}

    first = answers(3)
    assert answers(3) == first
    assert answers(4)["response"] != first["response"]
