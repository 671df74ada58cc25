"""`medgpt-ray chat` with the tiny model: answers stream in pieces that make up the answer, the history carries
every turn into the next prompt, /reset forgets it, and the terminal session runs end to end from stdin."""

from __future__ import annotations

import subprocess
import sys

from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.infer.chat import ChatSession
from medgpt_ray.infer.source import ModelSource


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
