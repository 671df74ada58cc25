"""A conversation with a trained model in one process: the history rendered with the chat template the model was
trained with (as batch generation renders a prompt), the answer streamed piece by piece as it is generated, every
answer on the session's decode path and thread (generation/session.py: on a GPU one static cache for the whole
conversation, the decode step compiled with CUDA graphs)."""

from __future__ import annotations

from collections.abc import Callable

from medgpt_ray.generation.engine import Generator
from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.generation.session import DecodeSession
from medgpt_ray.generation.stream import StreamedAnswer
from medgpt_ray.infer.source import ModelSource


class ChatSession:
    def __init__(self, source: ModelSource, params: GenerationParams, system: str | None = None,
                 generation_path: str = "auto"):
        self.generator = Generator(str(source.path), source.template, params.as_dict(), generation_path)
        self.decoding = DecodeSession(self.generator)
        self.system = system
        self.history: list[dict] = []
        self.reset()

    def reset(self) -> None:
        self.history = [{"role": "system", "content": self.system}] if self.system else []

    def prompt_text(self, next_text: str | None = None) -> str:
        """What the model reads: the history (ending on the user), or the history and a next user turn."""
        turns = self.history + ([{"role": "user", "content": next_text}] if next_text is not None else [])
        return self.generator.render(turns, [])

    def reply(self, text: str, on_text: Callable[[str], None] = lambda _: None) -> str:
        """The model's answer to `text` after the history so far, streamed to `on_text`; both join the history."""
        self.history.append({"role": "user", "content": text})
        pieces, answer = [], None
        try:
            answer = StreamedAnswer(self.generator, self.history, None, self.generator.params, session=self.decoding)
            for piece in answer:
                pieces.append(piece)
                on_text(piece)
        except BaseException:
            self.history.pop()  # the question goes with the answer that failed
            if answer is not None:  # (Ctrl-C) the session's thread is free for the next answer at the next token
                answer.cancel()
            raise
        text = "".join(pieces)
        self.history.append({"role": "assistant", "content": text})
        return text
