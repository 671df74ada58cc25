"""A conversation with a trained model in one process: the history rendered with the chat template the model was
trained with (as batch generation renders a prompt), the answer streamed piece by piece as it is generated."""

from __future__ import annotations

from collections.abc import Callable

from medgpt_ray.generation.engine import Generator
from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.generation.stream import StreamedAnswer
from medgpt_ray.infer.source import ModelSource


class ChatSession:
    def __init__(self, source: ModelSource, params: GenerationParams, system: str | None = None):
        self.generator = Generator(str(source.path), source.template, params.as_dict())
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
        pieces = []
        try:
            for piece in StreamedAnswer(self.generator, self.history, None, self.generator.params):
                pieces.append(piece)
                on_text(piece)
        except BaseException:
            self.history.pop()  # the question goes with the answer that failed
            raise
        answer = "".join(pieces)
        self.history.append({"role": "assistant", "content": answer})
        return answer
