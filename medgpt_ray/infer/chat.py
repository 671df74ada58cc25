"""A conversation with a trained model in one process: the history rendered with the chat template the model was
trained with (as batch generation renders a prompt), the answer streamed piece by piece as it is generated."""

from __future__ import annotations

import threading
from collections.abc import Callable

from medgpt_ray.infer.generator import GenerationParams, Generator
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
        import torch
        from transformers import TextIteratorStreamer

        g, p = self.generator, self.generator.params
        self.history.append({"role": "user", "content": text})
        enc = g.tok(self.prompt_text(), add_special_tokens=False, return_tensors="pt").to(g.device)
        streamer = TextIteratorStreamer(g.tok, skip_prompt=True, skip_special_tokens=True)
        sample = {"do_sample": True, "temperature": p.temperature, "top_p": p.top_p} if p.temperature > 0 else \
            {"do_sample": False}
        kwargs = {**enc, "max_new_tokens": p.max_new_tokens, "eos_token_id": g.stops,
                  "pad_token_id": g.tok.pad_token_id, "streamer": streamer, **sample}
        failure: list[BaseException] = []

        def run() -> None:
            try:
                with torch.no_grad():
                    g.model.generate(**kwargs)
            except BaseException as e:  # re-raised below, in the caller's thread
                failure.append(e)
                streamer.end()

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        pieces = []
        for piece in streamer:
            pieces.append(piece)
            on_text(piece)
        worker.join()
        if failure:
            self.history.pop()
            raise failure[0]
        answer = "".join(pieces)
        self.history.append({"role": "assistant", "content": answer})
        return answer
