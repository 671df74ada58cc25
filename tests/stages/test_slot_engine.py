"""Continuous batching on the static cache (generation/slot_engine.py, `serve --engine slots`) on the tiny model with
spread-out random weights: greedy answers equal the batch engine's with more requests than rows; requests that join
while others decode, with different lengths, past the cache's end (compacted), get the tokens each would get alone;
the decode step stays one compiled graph through joins and compactions; a short request behind a long one finishes
first; a cancelled request or one past its deadline gives its row back; a request no row can hold is refused."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from medgpt_ray.generation.continuous import DeadlineExceeded, PoolLimits
from medgpt_ray.generation.engine import Generator
from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.generation.slot_cache import slot_unsupported_reason
from medgpt_ray.generation.slot_engine import SlotEngine
from tests.stages.hybrid_models import save_tiny_hybrid
from tests.stages.test_continuous_engine import (  # noqa: F401  (spread_model: the fixture)
    QUESTIONS,
    finish_order,
    spread_model,
    turns,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/stages/conftest.py
MORE = [*QUESTIONS, "咳嗽三天了", "失眠多梦"]
LONGER = [*MORE, "胃痛", "腰痛怎么办"]


@pytest.fixture(scope="module")
def engine(spread_model):  # noqa: F811
    eng = SlotEngine(Generator(str(spread_model), "chatml", {"max_new_tokens": 12}),
                     PoolLimits(requests=3, tokens_per_request=40))
    yield eng
    eng.stop()


async def tokens_of(eng: SlotEngine, prompt: list[int], params: GenerationParams, delay: float = 0.0) -> list[int]:
    """The token ids a request gets (its last output's)."""
    await asyncio.sleep(delay)
    outputs: asyncio.Queue = asyncio.Queue()
    eng._start_request(f"t-{id(outputs)}", prompt, params, outputs.put_nowait)
    while not (out := await outputs.get()).is_finished():
        pass
    assert out.error is None
    return out.generated_tokens


def test_greedy_answers_equal_the_batch_engines_with_more_requests_than_rows(spread_model, engine):  # noqa: F811
    batch = Generator(str(spread_model), "chatml", {"max_new_tokens": 12})
    rows = batch({"prompt_id": list(range(len(MORE))), "tools": ["[]"] * len(MORE),
                  "conversations": [json.dumps(turns(q)) for q in MORE]})
    assert len(set(rows["response"])) > 1

    async def all_at_once():
        return await asyncio.gather(*[engine.complete(engine.prompt_ids(turns(q), None),
                                                      GenerationParams(max_new_tokens=12)) for q in MORE])

    answers = asyncio.run(all_at_once())
    assert [text for text, _ in answers] == rows["response"]
    assert [(a.prompt_tokens, a.new_tokens, a.finished) for _, a in answers] == \
        list(zip(rows["prompt_tokens"], rows["new_tokens"], rows["finished"], strict=True))
    assert not engine.rows and len(MORE) > engine.limits.requests


def test_requests_joining_mid_decode_and_past_the_caches_end_get_their_own_tokens(spread_model):  # noqa: F811
    """Eight requests on three rows, of different lengths: as one leaves the next joins while the others decode, so
    the shared column runs past the cache's end (64 columns) and is compacted; each answer is the greedy answer its
    prompt gets alone. With the decode step compiled (dynamo's eager backend on the CPU), joins and compactions reuse
    its one graph."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    gen = Generator(str(spread_model), "chatml", {"max_new_tokens": 12})
    compile_eager = CompileConfig(backend="eager", mode=None)
    torch._dynamo.reset()
    counters.clear()
    eng = SlotEngine(gen, PoolLimits(requests=3, tokens_per_request=32), compile_config=compile_eager)
    try:
        prompts = [eng.prompt_ids(turns(q), None) for q in LONGER]
        lengths = [25, 3, 9, 25, 5, 20, 25, 7]

        async def in_order():
            return await asyncio.gather(*[tokens_of(eng, p, GenerationParams(max_new_tokens=n))
                                          for p, n in zip(prompts, lengths, strict=True)])

        got = asyncio.run(in_order())
        assert eng.slots.compactions >= 1 and not eng.rows
    finally:
        eng.stop()
    for prompt, n, tokens in zip(prompts, lengths, got, strict=True):
        ids = torch.tensor([prompt])
        alone = gen.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                   eos_token_id=gen.stops, pad_token_id=0)[0, len(prompt):].tolist()
        assert tokens == alone[:len(tokens)] and (len(tokens) == n or tokens[-1] in gen.stops)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]


def test_a_short_request_behind_a_long_one_finishes_first(engine):
    assert finish_order(engine, 30, 3, 0.02) == ["short", "long"]


def test_a_seeded_request_samples_the_same_answer_alone_and_among_others(engine):
    """A request's seed is its own generator's (generation/sampler.py): alone or beside two unseeded sampled
    requests that take the other rows, it gets the same tokens; another seed, other tokens. Sampled at temperature
    1.5 with a top-k and a repetition penalty, so the settings reach the row too."""
    prompt = engine.prompt_ids(turns(QUESTIONS[0]), None)
    others = [engine.prompt_ids(turns(q), None) for q in QUESTIONS[1:3]]

    def seeded(seed: int) -> GenerationParams:
        return GenerationParams(max_new_tokens=12, temperature=1.5, top_k=50, repetition_penalty=1.2, seed=seed)

    async def answers():
        alone = await tokens_of(engine, prompt, seeded(7))
        crowded = await asyncio.gather(tokens_of(engine, prompt, seeded(7), delay=0.01), *[
            tokens_of(engine, ids, GenerationParams(max_new_tokens=12, temperature=1.0, seed=None)) for ids in others])
        return alone, crowded[0], await tokens_of(engine, prompt, seeded(8))

    alone, crowded, other = asyncio.run(answers())
    assert len(alone) == 12 and crowded == alone
    assert other != alone


def test_a_cancelled_request_and_one_past_its_deadline_give_their_rows_back(engine):
    prompt = engine.prompt_ids(turns(QUESTIONS[1]), None)

    async def late_leaving_then_good():
        with pytest.raises(DeadlineExceeded, match="deadline"):
            await engine.complete(prompt, GenerationParams(max_new_tokens=30, temperature=1.0), deadline_s=0.0001)
        answer = engine.new_answer(prompt)
        stream = engine.stream(prompt, GenerationParams(max_new_tokens=30, temperature=1.0), answer)
        async for _ in stream:
            break
        await stream.aclose()
        await asyncio.sleep(0.3)  # the engine drops cancelled requests between steps
        idle = not engine.rows and not engine.pending
        return idle, answer, await engine.complete(prompt, GenerationParams(max_new_tokens=5))

    idle, left, (_, good) = asyncio.run(late_leaving_then_good())
    assert idle and left.ttft_s is not None and left.new_tokens < 30
    assert good.new_tokens == 5 or good.finished


def test_a_reader_that_falls_behind_gets_what_it_missed_in_one_piece(engine):
    """Outputs queued while the reader was away are read as one piece (the latest holds every token so far): fewer
    pieces to stream, the same text."""
    prompt = engine.prompt_ids(turns(QUESTIONS[3]), None)
    params = GenerationParams(max_new_tokens=24)

    async def slow_reader():
        answer = engine.new_answer(prompt)
        stream = engine.stream(prompt, params, answer)
        pieces = [await stream.__anext__()]
        await asyncio.sleep(0.5)  # the engine finishes the answer meanwhile
        pieces += [p async for p in stream]
        return pieces, answer

    pieces, answer = asyncio.run(slow_reader())
    whole, _ = asyncio.run(engine.complete(prompt, params))
    assert "".join(pieces) == whole and answer.new_tokens > 3 and len(pieces) <= 3


def test_a_stream_interval_sends_the_first_token_at_once_then_fewer_pieces(engine):
    """serve's --stream-interval: after the first piece a piece waits for that many new tokens; the text is the
    same, the pieces (each costs the replica and Serve's proxy alike) fewer."""
    prompt = engine.prompt_ids(turns(QUESTIONS[3]), None)
    params = GenerationParams(max_new_tokens=24)

    async def read(interval: int):
        engine.stream_interval = interval
        answer = engine.new_answer(prompt)
        try:
            return [p async for p in engine.stream(prompt, params, answer)], answer
        finally:
            engine.stream_interval = 1

    (every, one), (grouped, four) = asyncio.run(read(1)), asyncio.run(read(4))
    assert "".join(every) == "".join(grouped) and one.new_tokens == four.new_tokens > 8
    assert four.ttft_s is not None and len(grouped) <= 1 + -(-(four.new_tokens - 1) // 4) < len(every)


def test_serves_limits_reach_the_slot_engine_which_auto_picks(spread_model):  # noqa: F811
    from medgpt_ray.infer.limits import ServeLimits
    from medgpt_ray.infer.serve_engine import serving_path

    limits = ServeLimits(max_prompt_tokens=48, max_tokens_limit=16, default_max_tokens=16, max_concurrent=2,
                         stream_interval=3)
    eng, fingerprint = serving_path(Generator(str(spread_model), "chatml", {}), limits, 512, "auto")
    try:
        assert eng.stream_interval == 3 and eng.limits.requests == 2 and eng.request_room == 2 * (48 + 16) - 1
        assert "static-cache slots: up to 2 requests" in fingerprint
    finally:
        eng.stop()


def test_a_request_no_row_can_hold_is_refused(engine):
    prompt = engine.prompt_ids(turns(QUESTIONS[2]), None)
    too_many = engine.request_room - len(prompt) + 1
    with pytest.raises(RuntimeError, match=f"exceed the {engine.request_room} a slot holds"):
        asyncio.run(engine.complete(prompt, GenerationParams(max_new_tokens=too_many)))


def test_a_request_that_fails_is_told_and_the_engine_goes_on(engine):
    """A prompt the model cannot read (a token id past its vocabulary) fails in its prefill: that request gets the
    error, not a hang; the next request is answered."""
    good = engine.prompt_ids(turns(QUESTIONS[0]), None)
    with pytest.raises(RuntimeError, match="generation failed: IndexError"):
        asyncio.run(engine.complete([*good, engine.gen.model.config.vocab_size + 5], GenerationParams(max_new_tokens=4),
                                    deadline_s=20))  # a hang would end as DeadlineExceeded, failing the test
    _, answer = asyncio.run(engine.complete(good, GenerationParams(max_new_tokens=4)))
    assert answer.new_tokens == 4 or answer.finished
    assert not engine.rows and not engine.admitting


def test_auto_serves_on_transformers_engine_where_slots_cannot_hold_the_layers(spread_model):  # noqa: F811
    from transformers import AutoConfig, Qwen3_5TextConfig

    from medgpt_ray.infer.serve_engine import engine_for

    dense = AutoConfig.from_pretrained(spread_model)
    sliding = AutoConfig.from_pretrained(spread_model, use_sliding_window=True, sliding_window=16,
                                         layer_types=["sliding_attention", "full_attention"])
    hybrid = Qwen3_5TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                               layer_types=["linear_attention", "full_attention"])
    assert "sliding_attention" in sliding.layer_types
    assert [engine_for("auto", c) for c in (dense, sliding, hybrid)] == ["slots", "transformers", "slots"]
    assert engine_for("slots", sliding) == "slots"  # named: serving_path then says why it cannot
    assert "sliding-window" in slot_unsupported_reason(sliding) and slot_unsupported_reason(hybrid) is None
    with pytest.raises(ValueError, match="engine 'fast': one of auto, transformers, slots"):
        engine_for("fast", dense)


def test_serve_says_which_engine_and_why_not_ours(spread_model, tmp_path):  # noqa: F811
    """`serve`'s start line: slots for a dense model; transformers' engine only with its reason (auto and a
    sliding-window model) or because it was named; a named slots engine that cannot hold the layers says so."""
    import shutil

    from medgpt_ray.infer.serve_engine import engine_line

    sliding = tmp_path / "sliding"
    shutil.copytree(spread_model, sliding)
    cfg = json.loads((sliding / "config.json").read_text())
    (sliding / "config.json").write_text(json.dumps({**cfg, "use_sliding_window": True, "sliding_window": 16,
                                                     "layer_types": ["sliding_attention", "full_attention"]}))
    assert engine_line(str(spread_model), "auto").startswith("engine: slots")
    assert engine_line(str(sliding), "auto") == ("engine: transformers' continuous batching (auto: sliding-window "
                                                 "layers keep a cache shorter than the slots' columns)")
    assert engine_line(str(spread_model), "transformers") == \
        "engine: transformers' continuous batching (--engine transformers)"
    assert engine_line(str(sliding), "slots").startswith("engine: one generate call per request (--engine slots: ")


@pytest.fixture(scope="module")
def spread_hybrid(spread_model, tmp_path_factory):  # noqa: F811
    """A tiny Qwen3.5 (linear attention, then full attention, twice) with the spread model's tokenizer and chat
    template and weights drawn as wide: its greedy answers depend on the prompt."""
    out = save_tiny_hybrid(spread_model, tmp_path_factory.mktemp("spread-hybrid"),
                           ["linear_attention", "full_attention"] * 2, spread=0.3)
    for f in spread_model.iterdir():
        if f.name.endswith(".jinja"):
            (out / f.name).write_bytes(f.read_bytes())
    return out


def test_a_hybrid_on_slots_gives_each_request_its_own_tokens(spread_hybrid):
    """Linear-attention layers keep a state per row: requests joining while others decode, and past the cache's end
    (compacted), each get the greedy answer their prompt gets alone, in one compiled graph."""
    test_requests_joining_mid_decode_and_past_the_caches_end_get_their_own_tokens(spread_hybrid)
