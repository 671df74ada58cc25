"""The Generator (generation/engine.py: `generate`, the eval stage) on the static decode path, forced on the CPU with
the tiny model: greedy answers are the dynamic path's; batches of different prompt lengths and a short last batch
reuse the one static cache and, with transformers' compilation forced onto the CPU (dynamo's eager backend), the one
compiled decode step. The CUDA graphs themselves take a GPU (bench/generation_throughput.py)."""

from __future__ import annotations

import json

import pytest

from medgpt_ray.generation.engine import Generator, prompt_room

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/stages/conftest.py

TURNS = [[{"role": "user", "content": "发烧了需要吃什么药？"}],
         [{"role": "system", "content": "你是医生"}, {"role": "user", "content": "头痛，失眠，心慌，怎么办？" * 3}],
         [{"role": "user", "content": "咳嗽"}]]


def scramble(model) -> None:
    """Random matrices (seeded; a LoRA adapter's too): the tiny model's own greedy answer is a row of newlines on
    every prompt, which any decode would match; random weights answer each prompt differently."""
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)


def batch(turns: list[list[dict]]) -> dict[str, list]:
    return {"prompt_id": [str(i) for i in range(len(turns))], "conversations": [json.dumps(t) for t in turns],
            "tools": ["[]"] * len(turns)}


def test_the_static_path_answers_as_the_dynamic_one_on_one_cache(tiny_model):
    import torch
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    dynamic = Generator(str(tiny_model), "chatml", {"max_new_tokens": 8})
    static = Generator(str(tiny_model), "chatml", {"max_new_tokens": 8}, generation_path="static")
    assert (dynamic.path.name, static.path.name) == ("dynamic", "static")
    scramble(dynamic.model)
    scramble(static.model)
    static.compile_config = CompileConfig(backend="eager", mode=None)
    static.compile_config._compile_all_devices = True  # transformers compiles the decode step on the CPU too
    torch._dynamo.reset()
    counters.clear()
    batches = [batch(TURNS[:2]), batch(TURNS[2:]), batch(TURNS[:2][::-1])]  # a longer one, a short last one
    outs = [static(b) for b in batches]
    answers, dynamic_outs = [o["response"] for o in outs], [dynamic(b) for b in batches]
    assert answers == [o["response"] for o in dynamic_outs]
    # Only the call that built the cache (and compiled the decode step) is flagged as warm-up, on each of its rows.
    assert [o["warmup"] for o in outs] == [[True, True], [False], [False, False]]
    assert not any(flag for o in dynamic_outs for flag in o["warmup"])
    assert len({a for answer in answers for a in answer}) == 3  # three prompts, three answers
    assert static.decoder.builds == 1 and static.rows == 2 and counters["stats"]["unique_graphs"] == 1
    assert static.decoder.loop == "medgpt"


def test_the_prompt_room_is_a_power_of_two():
    assert [prompt_room(n) for n in (1, 128, 129, 300, 512, 513)] == [128, 128, 256, 512, 512, 1024]


def test_a_static_cache_that_would_not_fit_falls_back_to_the_dynamic_path(tiny_model):
    from medgpt_ray.generation.decode_path import static_cache_bytes

    gen = Generator(str(tiny_model), "chatml", {"max_new_tokens": 8}, generation_path="static")
    need = static_cache_bytes(gen.model.config, 2, prompt_room(1) + 8, 4)  # the tiny model is fp32 on the CPU
    gen.memory_room = int(need / 0.9) - 1  # a byte short of room for the first batch's cache
    rows = gen(batch(TURNS[:2]))
    assert gen.path.name == "dynamic" and gen.decoder is None
    assert rows["decode_path"][0].startswith("dynamic (static refused: its cache of 2 x 136 tokens takes")
    roomy = Generator(str(tiny_model), "chatml", {"max_new_tokens": 8}, generation_path="static")
    roomy.memory_room = int(need / 0.9) + 1
    roomy(batch(TURNS[:2]))
    assert roomy.path.name == "static" and roomy.decoder.builds == 1
