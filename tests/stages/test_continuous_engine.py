"""Continuous batching across requests (medgpt_ray/generation/continuous.py, what `serve` answers with) on a tiny
model with spread-out random weights (so that different prompts get different greedy answers): greedy answers equal
the batch engine's, a short request that arrives behind a long one finishes first (continuous, not one after the
other), and a request that passes its deadline or whose reader leaves is cancelled with its pages given back."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from medgpt_ray.generation.continuous import ContinuousEngine, DeadlineExceeded, PoolLimits, unsupported_reason
from medgpt_ray.generation.engine import Generator
from medgpt_ray.generation.params import GenerationParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/stages/conftest.py

QUESTIONS = ["头痛怎么办？", "发烧了需要吃什么药？", "高血压患者饮食注意什么", "what is a fever"]


@pytest.fixture(scope="module")
def spread_model(tiny_model, tmp_path_factory) -> Path:
    """The tiny model with weights drawn wide: its greedy answers depend on the prompt (the plain tiny model answers
    every prompt with the same newline)."""
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("spread")
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    model.save_pretrained(out)
    for f in Path(tiny_model).iterdir():
        if "token" in f.name or f.name.endswith(".jinja"):
            (out / f.name).write_bytes(f.read_bytes())
    return out


@pytest.fixture(scope="module")
def engine(spread_model):
    gen = Generator(str(spread_model), "chatml", {"max_new_tokens": 12})
    eng = ContinuousEngine(gen, PoolLimits(requests=8, tokens_per_request=256))
    yield eng
    eng.stop()


def turns(q: str) -> list[dict]:
    return [{"role": "user", "content": q}]


def idle(eng: ContinuousEngine) -> bool:
    """No request holds a slot or waits, and no reader is registered."""
    sched = eng.manager.batch_processor.scheduler
    return not sched.active_requests and not sched.waiting_requests and not eng.manager.output_router.result_handlers


def test_greedy_answers_equal_the_batch_engines(spread_model, engine):
    batch = Generator(str(spread_model), "chatml", {"max_new_tokens": 12})
    rows = batch({"prompt_id": list(range(len(QUESTIONS))), "tools": ["[]"] * len(QUESTIONS),
                  "conversations": [json.dumps(turns(q)) for q in QUESTIONS]})
    assert len(set(rows["response"])) > 1, "the prompts must get different answers for the comparison to mean much"

    async def all_at_once():
        return await asyncio.gather(*[engine.complete(engine.prompt_ids(turns(q), None),
                                                      GenerationParams(max_new_tokens=12)) for q in QUESTIONS])

    answers = asyncio.run(all_at_once())
    assert [text for text, _ in answers] == rows["response"]
    assert [(a.prompt_tokens, a.new_tokens, a.finished) for _, a in answers] == \
        list(zip(rows["prompt_tokens"], rows["new_tokens"], rows["finished"], strict=True))


def finish_order(engine, long_new: int, short_new: int, delay: float) -> list[str]:
    """The order in which a long request and a short one sent `delay` s after it finish (either engine)."""
    order: list[str] = []

    async def ask(name: str, max_new: int, wait: float) -> None:
        await asyncio.sleep(wait)
        prompt = engine.prompt_ids(turns(QUESTIONS[0]), None)
        await engine.complete(prompt, GenerationParams(max_new_tokens=max_new, temperature=1.0))
        order.append(name)

    async def both():
        await asyncio.gather(ask("long", long_new, 0.0), ask("short", short_new, delay))

    asyncio.run(both())
    return order


def test_a_short_request_behind_a_long_one_finishes_first(engine):
    assert finish_order(engine, 200, 3, 0.05) == ["short", "long"]


def test_a_request_past_its_deadline_is_cancelled_and_freed(engine):
    prompt = engine.prompt_ids(turns(QUESTIONS[1]), None)

    async def late_then_good():
        with pytest.raises(DeadlineExceeded, match="deadline"):
            await engine.complete(prompt, GenerationParams(max_new_tokens=240, temperature=1.0), deadline_s=0.2)
        await asyncio.sleep(0.3)  # the scheduler thread drops the cancelled request at its next step
        cancelled_idle = idle(engine)
        return cancelled_idle, await engine.complete(prompt, GenerationParams(max_new_tokens=5))

    cancelled_idle, (_, answer) = asyncio.run(late_then_good())
    assert cancelled_idle
    assert answer.new_tokens > 0 or answer.finished


def test_a_reader_that_leaves_cancels_its_request(engine):
    prompt = engine.prompt_ids(turns(QUESTIONS[2]), None)

    async def leave_after_one_piece():
        answer = engine.new_answer(prompt)
        stream = engine.stream(prompt, GenerationParams(max_new_tokens=240, temperature=1.0), answer)
        async for _ in stream:
            break
        await stream.aclose()
        await asyncio.sleep(0.3)
        return answer

    answer = asyncio.run(leave_after_one_piece())
    assert answer.ttft_s is not None and answer.new_tokens < 240
    assert idle(engine)


def test_a_hybrid_model_is_named_unsupported():
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                               layer_types=["linear_attention", "full_attention"])
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(config)
    assert "linear attention" in unsupported_reason(model.config)
