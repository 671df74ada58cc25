"""One answer generated in a thread and read piece by piece as it grows (chat, serving), with the engine's model.
A reader may cancel it, or give it a deadline: generation itself stops at the next token (a stopping criterion
checks both), so the thread and its compute are freed, not only the reader.

With a DecodeSession (chat: generation/session.py) the answer is generated on the session's one thread and decode
path (static on a GPU: one cache for the conversation, the decode step compiled with CUDA graphs); without one
(serve's fallback for linear-attention models, many requests at once) in a thread of its own on the dynamic path."""

from __future__ import annotations

import threading
import time
from typing import Any

from medgpt_ray.generation.engine import Generator
from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.generation.prompts import prompt_token_ids
from medgpt_ray.generation.session import DecodeSession

# A prompt longer than this many characters per allowed token is first counted on its start alone: tokenizing a
# whole 1 MiB prompt to learn that it is too long took 0.9 s and 143 MB of a serving replica on the tiny model.
PROBE_CHARS_PER_TOKEN = 8


class PromptTooLong(ValueError):
    """The rendered prompt has more tokens than the caller allows; nothing was generated. `tokens` is the count, or
    with `at_least` the count of its start alone (already over the limit)."""

    def __init__(self, tokens: int, limit: int, at_least: bool = False):
        super().__init__(f"the prompt is {'over ' if at_least else ''}{tokens} tokens, over the limit of {limit}")
        self.tokens, self.limit, self.at_least = tokens, limit, at_least


def _check_length(tok: Any, text: str, limit: int | None) -> None:
    """PromptTooLong if `text` is over `limit` tokens, known from its start where that suffices (the tokens at the cut
    may differ from the whole text's, hence the margin); otherwise the caller counts the whole."""
    probe = (limit or 0) * PROBE_CHARS_PER_TOKEN
    if limit is not None and len(text) > probe:
        start = len(tok(text[:probe], add_special_tokens=False)["input_ids"])
        if start > limit + 16:
            raise PromptTooLong(limit, limit, at_least=True)


def _stop_criterion(cancelled: threading.Event, deadline: float | None, stopped: threading.Event):
    """A transformers StoppingCriteria that ends every row once `cancelled` is set or `deadline` (monotonic) passed;
    it sets `stopped` when it does (a cancel after the answer ended stops nothing)."""
    import torch
    from transformers import StoppingCriteria

    class CancelOrDeadline(StoppingCriteria):
        host_only = True  # it reads a flag and the clock: the static decode loop may call it every step

        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
            if deadline is not None and time.monotonic() >= deadline:
                cancelled.set()
            if cancelled.is_set():
                stopped.set()
            return torch.full((input_ids.shape[0],), cancelled.is_set(), dtype=torch.bool, device=input_ids.device)

    return CancelOrDeadline()


def prompt_ids(gen: Generator, turns: list[dict], tools: list[dict] | None,
               max_prompt_tokens: int | None = None) -> list[int]:
    """The conversation rendered as the model's prompt and tokenized; PromptTooLong past `max_prompt_tokens` (a
    prompt far past it is refused from its start, without tokenizing it whole)."""
    text = gen.render(turns, tools or [])
    _check_length(gen.tok, text, max_prompt_tokens)
    ids = prompt_token_ids(gen.tok, gen.template, turns, tools or [], text)
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
        raise PromptTooLong(len(ids), max_prompt_tokens)
    return ids


class StreamedAnswer:
    """After the pieces: prompt_tokens, new_tokens (up to the stop token), finished (it stopped on its own, not at
    the limit) and stopped (cancelled, or its deadline passed, before it finished)."""

    def __init__(self, gen: Generator, turns: list[dict], tools: list[dict] | None, params: GenerationParams,
                 deadline: float | None = None, max_prompt_tokens: int | None = None,
                 session: DecodeSession | None = None):
        import torch
        from transformers import StoppingCriteriaList, TextIteratorStreamer

        ids = torch.tensor([prompt_ids(gen, turns, tools, max_prompt_tokens)], device=gen.device)
        self.prompt_tokens = int(ids.shape[1])
        self._gen, self._ids, self._error = gen, [], None
        self._cancelled, self._stopped, self._done = threading.Event(), threading.Event(), threading.Event()
        self._streamer = TextIteratorStreamer(gen.tok, skip_prompt=True, skip_special_tokens=True)
        stop = _stop_criterion(self._cancelled, deadline, self._stopped)
        kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": params.max_new_tokens,
                  "eos_token_id": gen.stops,
                  "pad_token_id": gen.tok.pad_token_id, "streamer": self._streamer,
                  "stopping_criteria": StoppingCriteriaList([stop]), **params.sampling()}
        if session is None:
            threading.Thread(target=self._run, args=(kwargs, gen.model.generate), daemon=True).start()
        else:
            session.submit(lambda: self._run(kwargs, session.generate))

    def _run(self, kwargs: dict[str, Any], generate: Any) -> None:
        import torch

        try:
            with torch.no_grad():
                self._ids = generate(**kwargs)[0, self.prompt_tokens:].tolist()
        except BaseException as e:  # raised again in the reader's thread, after the pieces so far
            self._error = e
            self._streamer.end()
        finally:
            self._done.set()

    def __iter__(self):
        yield from self._streamer
        self._done.wait()
        if self._error is not None:
            raise self._error

    async def pieces(self):
        """The pieces on an event loop (serving; ContinuousAnswer's interface): each awaited in a worker thread,
        since the streamer blocks until the next token."""
        import asyncio

        it = iter(self)
        while (piece := await asyncio.to_thread(next, it, None)) is not None:
            yield piece

    def cancel(self) -> None:
        """Stop generating at the next token (harmless once finished)."""
        self._cancelled.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the generation to end; True when it has."""
        return self._done.wait(timeout)

    @property
    def new_tokens(self) -> int:
        return next((n for n, t in enumerate(self._ids) if t in self._gen.stops), len(self._ids))

    @property
    def finished(self) -> bool:
        return self.new_tokens < len(self._ids)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set() and not self.finished
