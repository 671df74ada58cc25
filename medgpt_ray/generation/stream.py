"""One answer generated in a thread and read piece by piece as it grows (chat, serving), with the engine's model."""

from __future__ import annotations

from typing import Any

from medgpt_ray.generation.engine import Generator
from medgpt_ray.generation.params import GenerationParams


class StreamedAnswer:
    """After the pieces: prompt_tokens, new_tokens (up to the stop token) and finished (it stopped on its own, not at
    the limit)."""

    def __init__(self, gen: Generator, turns: list[dict], tools: list[dict] | None, params: GenerationParams):
        import threading

        from transformers import TextIteratorStreamer

        enc = gen.tok(gen.render(turns, tools or []), add_special_tokens=False, return_tensors="pt").to(gen.device)
        self.prompt_tokens = int(enc["input_ids"].shape[1])
        self._gen, self._ids, self._error = gen, [], None
        self._streamer = TextIteratorStreamer(gen.tok, skip_prompt=True, skip_special_tokens=True)
        kwargs = {**enc, "max_new_tokens": params.max_new_tokens, "eos_token_id": gen.stops,
                  "pad_token_id": gen.tok.pad_token_id, "streamer": self._streamer, **params.sampling()}
        self._thread = threading.Thread(target=self._run, args=(kwargs,), daemon=True)
        self._thread.start()

    def _run(self, kwargs: dict[str, Any]) -> None:
        import torch

        try:
            with torch.no_grad():
                self._ids = self._gen.model.generate(**kwargs)[0, self.prompt_tokens:].tolist()
        except BaseException as e:  # raised again in the reader's thread, after the pieces so far
            self._error = e
            self._streamer.end()

    def __iter__(self):
        yield from self._streamer
        self._thread.join()
        if self._error is not None:
            raise self._error

    @property
    def new_tokens(self) -> int:
        return next((n for n, t in enumerate(self._ids) if t in self._gen.stops), len(self._ids))

    @property
    def finished(self) -> bool:
        return self.new_tokens < len(self._ids)
