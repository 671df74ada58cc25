"""`medgpt-ray chat` with the tiny model: answers stream in pieces that make up the answer, the history carries
every turn into the next prompt, /reset forgets it, the terminal session runs end to end from stdin and names its
decode path, and a chat forced onto the static path streams the dynamic path's answers on one cache."""

from __future__ import annotations

import subprocess
import sys

from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.infer.chat import ChatSession
from medgpt_ray.infer.source import ModelSource
from tests.stages.test_static_generator import scramble


def test_streamed_multi_turn_and_reset(tiny_model):
    session = ChatSession(ModelSource(tiny_model, "chatml"), GenerationParams(max_new_tokens=8), system="你是医生")
    pieces: list[str] = []
    first = session.reply("头痛怎么办？", pieces.append)
    assert len(pieces) >= 2 and "".join(pieces) == first  # streamed, and nothing lost
    second = session.reply("需要吃药吗？")
    assert [t["role"] for t in session.history] == ["system", "user", "assistant", "user", "assistant"]
    assert session.history[-1]["content"] == second
    prompt = session.prompt_text("还有呢？")
    assert "头痛怎么办？" in prompt and "你是医生" in prompt and first in prompt and second in prompt
    session.reset()
    assert session.history == [{"role": "system", "content": "你是医生"}]
    assert "头痛怎么办？" not in session.prompt_text("还有呢？")


def test_the_terminal_session_from_stdin(tiny_model):
    stdin = "头痛怎么办\n/reset\n/foo\n你好\n/exit\n"
    done = subprocess.run([sys.executable, "-m", "medgpt_ray.cli", "chat", "--model", str(tiny_model), "--template",
                           "chatml", "--max-new-tokens", "4"], input=stdin, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("bot> ") == 2 and "(conversation cleared)" in done.stdout
    assert "unknown command /foo" in done.stdout and "Loading weights" not in done.stderr
    assert "decode path dynamic (auto: on the CPU a compiled decode step saves nothing)" in done.stdout


def test_a_static_chat_streams_the_dynamic_answers_on_one_cache(tiny_model):
    """Two turns on each path, the same (scrambled) weights: the same greedy text, streamed; the static path builds
    its cache once and resets it for the second turn, with transformers' compilation of the decode step forced onto
    the CPU (dynamo's eager backend) replaying one compiled step in both turns."""
    import torch
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    source, params = ModelSource(tiny_model, "chatml"), GenerationParams(max_new_tokens=8)
    dynamic, static = (ChatSession(source, params, "你是医生", path) for path in ("dynamic", "static"))
    assert (dynamic.decoding.path.name, static.decoding.path.name) == ("dynamic", "static")
    for session in (dynamic, static):
        scramble(session.generator.model)
    static.generator.compile_config = CompileConfig(backend="eager", mode=None)
    static.generator.compile_config._compile_all_devices = True  # transformers compiles the decode step on the CPU
    torch._dynamo.reset()
    counters.clear()
    answers: dict[str, list[str]] = {"dynamic": [], "static": []}
    for question in ("头痛怎么办？", "需要吃药吗？"):
        for name, session in (("dynamic", dynamic), ("static", static)):
            pieces: list[str] = []
            answers[name].append(session.reply(question, pieces.append))
            assert "".join(pieces) == answers[name][-1] and len(pieces) >= 2  # streamed
        if question == "头痛怎么办？":
            first, cache = static.decoding.decoder, static.decoding.decoder.cache
    assert answers["static"] == answers["dynamic"] and len(set(answers["static"])) == 2
    assert dynamic.decoding.decoder is None
    assert static.decoding.decoder is first and first.cache is cache and first.builds == 1  # reset, not made anew
    assert counters["stats"]["unique_graphs"] == 1
    assert first.loop == "medgpt"  # streamed, with its cancel-or-deadline criterion, by the static decode loop


def test_a_conversation_that_outgrows_the_static_cache_gets_a_longer_one(tiny_model, monkeypatch):
    from medgpt_ray.generation import session as decode_session

    assert [decode_session.cache_length(n) for n in (1, 2048, 2049)] == [2048, 2048, 4096]
    assert decode_session.cache_length(100, before=4096) == 8192  # grown: twice the last
    monkeypatch.setattr(decode_session, "CACHE_FLOOR", 32)  # a few turns outgrow it
    source, params = ModelSource(tiny_model, "chatml"), GenerationParams(max_new_tokens=8)
    dynamic, static = (ChatSession(source, params, "你是医生", path) for path in ("dynamic", "static"))
    for session in (dynamic, static):
        scramble(session.generator.model)
    lengths = []
    for question in ("头痛怎么办？", "需要吃药吗？", "还有呢？", "谢谢"):
        assert static.reply(question) == dynamic.reply(question)
        lengths.append(static.decoding.decoder.max_len)
    assert lengths == sorted(lengths) and all(n >= 32 and n & (n - 1) == 0 for n in lengths)  # powers of two
    assert lengths[-1] > lengths[0] and static.decoding.decoder.builds == len(set(lengths))
