"""Continuous batching across requests (serving): every request joins the running decode batch at the next step
instead of waiting for the requests before it, through transformers' own engine (`init_continuous_batching`: a paged
KV cache, a scheduler thread, per-request sampling). Its page pool is sized here from the server's limits (requests
at once x tokens a request may hold), never left to take "90 % of free GPU memory" (its default).

Sampling is per request: the engine is built sampling, with temperature and top_p given to each request (its
per-request logits processors); a greedy request (temperature 0) samples at GREEDY_TEMPERATURE, where the softmax is
one-hot on the argmax for any logit gap above ~1e-3. Models the engine cannot run (a hybrid with linear-attention
layers; a transformers without continuous batching) are named by `unsupported_reason` and served one request at a
time by the caller."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from medgpt_ray.generation.engine import Generator
from medgpt_ray.generation.params import GenerationParams

GREEDY_TEMPERATURE = 1e-4
PAGE_TOKENS = 256  # transformers' default page size (tokens per layer per page)
# Built with a temperature and top_p other than 1.0: only then does the engine create the per-request processors.
BUILT_TEMPERATURE, BUILT_TOP_P = 0.7, 0.95


class DeadlineExceeded(Exception):
    """The request ran past its deadline; its generation was cancelled and its pages freed."""


@dataclass(frozen=True)
class PoolLimits:
    """What the page pool must hold: `requests` at once, each up to `tokens_per_request` (prompt and answer)."""

    requests: int
    tokens_per_request: int

    @property
    def pages(self) -> int:
        return self.requests * math.ceil(self.tokens_per_request / PAGE_TOKENS)


@dataclass
class Answer:
    """One request's outcome so far: filled in while its pieces are read."""

    request_id: str
    prompt_tokens: int
    new_tokens: int = 0
    finished: bool = False  # stopped on its own stop token, not at max_new_tokens
    ttft_s: float | None = None  # seconds from submission to the first piece
    # Where the request asked for logprobs (the slots): per generated token so far, (its id, its log-probability,
    # [(token id, log-probability)] of the likeliest), as slot_engine.SlotOutput carries them.
    logprobs: list | None = None


def page_bytes(model: Any) -> int:
    """One page of the paged KV cache: K and V of PAGE_TOKENS tokens in every full-attention layer."""
    text = model.config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * model.dtype.itemsize * PAGE_TOKENS


def pool_pages(model: Any, limits: PoolLimits, free_share: float = 0.8) -> int:
    """The pages the pool gets: what `limits` asks for, or what `free_share` of the free memory (the GPU's, else the
    host's) holds when that is less (requests past it wait for pages, they are not refused); at least one request's
    worth."""
    import os

    import torch

    if model.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(model.device)
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    pages = min(limits.pages, int(free_share * free) // page_bytes(model))
    one = math.ceil(limits.tokens_per_request / PAGE_TOKENS)
    if pages < one:
        raise ValueError(f"the GPU's free memory holds {pages} KV-cache pages of {PAGE_TOKENS} tokens; one request of "
                         f"{limits.tokens_per_request} tokens needs {one}: lower --max-tokens-limit or "
                         "--max-prompt-tokens")
    return pages


def pool_config(pages: int, **options: Any) -> Any:
    """transformers' ContinuousBatchingConfig for a pool of `pages` pages of PAGE_TOKENS tokens. The page size's
    keyword is `page_size` in transformers 5.24 (`block_size` is its deprecated alias) and `block_size` in 5.17
    (the GPU machine's), which has no `page_size`."""
    import inspect

    from transformers import ContinuousBatchingConfig

    size_key = "page_size" if "page_size" in inspect.signature(ContinuousBatchingConfig).parameters else "block_size"
    return ContinuousBatchingConfig(num_blocks=pages, **{size_key: PAGE_TOKENS}, **options)


def unsupported_reason(config: Any) -> str | None:
    """Why transformers' continuous batching cannot run a model of this config (its config.json's), or None."""
    try:
        from transformers import ContinuousBatchingConfig  # noqa: F401
    except ImportError:
        import transformers

        return f"transformers {transformers.__version__} has no continuous batching"
    layer_types = set(getattr(config.get_text_config(), "layer_types", None) or ())
    if layer_types - {"full_attention", "sliding_attention"}:
        return f"its layer types {sorted(layer_types)} include linear attention, which the paged cache cannot hold"
    return None


class RequestEngine:
    """What `serve` asks of an engine that batches concurrent requests (ContinuousEngine: transformers' own;
    slot_engine.SlotEngine: ours on the static cache): requests started with `_start_request`, whose outputs
    (`generated_tokens`, `error`, `is_finished()`) reach a handler on the caller's event loop, and `cancel`, which
    stops one at the engine's next step and forgets its handler. The answers' text, streamed, is the same for both."""

    gen: Generator
    request_room: int | None = None  # the most prompt + new tokens one request may hold (None: no fixed limit)
    # New tokens a streamed piece waits for after the first (serve's --stream-interval): each piece costs the
    # replica and Serve's proxy the same whatever it holds, so under load pieces of one token cap the tokens/s.
    stream_interval: int = 1

    def unsupported(self, params: GenerationParams) -> str | None:
        """The request setting this engine cannot honour, by its OpenAI field name (None: it honours them all).
        transformers' engine samples every request from one generator, with temperature and top_p only."""
        if params.seed is not None:  # a request's own (serve sets None where the body has none; 0 is a seed)
            return "seed"
        defaults = GenerationParams(max_new_tokens=params.max_new_tokens)
        for field in ("top_k", "repetition_penalty"):
            if getattr(params, field) != getattr(defaults, field):
                return field
        return params.generate_cannot()

    def _start_request(self, request_id: str, prompt_ids: list[int], params: GenerationParams,
                       on_output: Any) -> None:
        raise NotImplementedError

    def cancel(self, request_id: str) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def prompt_ids(self, turns: list[dict], tools: list[dict] | None) -> list[int]:
        from medgpt_ray.generation.stream import prompt_ids

        return prompt_ids(self.gen, turns, tools)

    async def stream(self, prompt_ids: list[int], params: GenerationParams, answer: Answer,
                     deadline_s: float | None = None) -> AsyncIterator[str]:
        """The answer's text as it grows, piece by piece. Leaving early (a client gone, a deadline passed, an error)
        cancels the request, which frees its room for the others."""
        outputs: asyncio.Queue = asyncio.Queue()
        start, done, emitted, sent = time.monotonic(), False, "", 0
        self._start_request(answer.request_id, prompt_ids, params, outputs.put_nowait)
        try:
            while not done:
                left = None if deadline_s is None else deadline_s - (time.monotonic() - start)
                if left is not None and left <= 0:
                    raise DeadlineExceeded(f"the request passed its {deadline_s:g} s deadline")
                try:
                    out = await asyncio.wait_for(outputs.get(), timeout=left)
                except TimeoutError:
                    raise DeadlineExceeded(f"the request passed its {deadline_s:g} s deadline") from None
                while not outputs.empty():  # a reader behind: the latest output (each holds every token so far)
                    out = outputs.get_nowait()
                if out.error:
                    raise RuntimeError(f"generation failed: {out.error}")
                answer.logprobs = getattr(out, "logprobs", None)  # transformers' outputs carry none
                done = out.is_finished()
                if not done and emitted and len(out.generated_tokens) - sent < self.stream_interval:
                    continue  # the first piece at once, then one per stream_interval tokens
                text = self._text(out.generated_tokens, answer)
                # A piece that ends inside a multi-byte character waits for the next token (unless it is the last).
                if text.startswith(emitted) and len(text) > len(emitted) and (done or not text.endswith("\ufffd")):
                    if answer.ttft_s is None:
                        answer.ttft_s = time.monotonic() - start
                    yield text[len(emitted):]
                    emitted, sent = text, len(out.generated_tokens)
        finally:
            if not done:
                self.cancel(answer.request_id)

    def _text(self, ids: list[int], answer: Answer) -> str:
        from medgpt_ray.generation.prompts import answer_until_stop

        text, answer.new_tokens, answer.finished = answer_until_stop(self.gen.tok, self.gen.stops, ids)
        return text

    def new_answer(self, prompt_ids: list[int]) -> Answer:
        return Answer(request_id=f"req-{next(self._ids)}", prompt_tokens=len(prompt_ids))

    async def complete(self, prompt_ids: list[int], params: GenerationParams,
                       deadline_s: float | None = None) -> tuple[str, Answer]:
        """The whole answer at once (a request that did not ask for a stream)."""
        answer = self.new_answer(prompt_ids)
        pieces = [p async for p in self.stream(prompt_ids, params, answer, deadline_s)]
        return "".join(pieces), answer


class ContinuousEngine(RequestEngine):
    """One model's continuous-batching engine (a serve replica's): started once, answered from any number of
    concurrent requests on the caller's event loop."""

    def __init__(self, gen: Generator, limits: PoolLimits, seed: int = 0):
        from transformers import GenerationConfig

        reason = unsupported_reason(gen.model.config)
        if reason is not None:
            raise ValueError(f"continuous batching is not available for this model: {reason}")
        self.gen, self.limits = gen, limits
        config = GenerationConfig(do_sample=True, temperature=BUILT_TEMPERATURE, top_p=BUILT_TOP_P,
                                  max_new_tokens=limits.tokens_per_request, eos_token_id=gen.stops,
                                  pad_token_id=gen.tok.pad_token_id)
        pool = pool_config(pool_pages(gen.model, limits), max_requests_per_batch=limits.requests,
                           max_batch_tokens=max(limits.tokens_per_request, 256), allow_block_sharing=False,
                           per_request_processors=True, seed=seed)
        self.manager = gen.model.init_continuous_batching(generation_config=config, continuous_batching_config=pool)
        self.manager.start()
        self._ids = itertools.count()

    def stop(self) -> None:
        self.manager.stop(block=True)

    def _start_request(self, request_id: str, prompt_ids: list[int], params: GenerationParams,
                       on_output: Any) -> None:
        self.manager.register_result_handler(request_id, on_output)  # delivered on this (the caller's) event loop
        sampling = {"temperature": params.temperature if params.temperature > 0 else GREEDY_TEMPERATURE,
                    "top_p": params.top_p if params.temperature > 0 else 1.0}
        self.manager.add_request(prompt_ids, request_id=request_id, max_new_tokens=params.max_new_tokens,
                                 streaming=True, eos_token_id=self.gen.stops, **sampling)

    def cancel(self, request_id: str) -> None:
        self.manager.cancel_request(request_id)
        with self.manager.output_router._lock:  # a cancelled request gets no last output to clean it up
            self.manager.output_router.result_handlers.pop(request_id, None)


class ContinuousAnswer:
    """One request's answer on the engine, read as StreamedAnswer's is (serving): its prompt checked against
    `max_prompt_tokens` first (PromptTooLong), then `pieces()` to iterate on the caller's event loop; `cancel()`
    stops it at the engine's next step; after the pieces: prompt_tokens, new_tokens, finished, stopped (the deadline
    or a cancel came first)."""

    def __init__(self, engine: RequestEngine, turns: list[dict], tools: list[dict] | None,
                 params: GenerationParams, deadline: float | None = None, max_prompt_tokens: int | None = None):
        from medgpt_ray.generation.stream import prompt_ids

        ids = prompt_ids(engine.gen, turns, tools, max_prompt_tokens)
        self.engine, self.params, self.deadline, self._ids = engine, params, deadline, ids
        self.answer = engine.new_answer(ids)
        self.stopped, self._over = False, False

    async def pieces(self) -> AsyncIterator[str]:
        """The pieces; the request is submitted when the first is asked for."""
        left = None if self.deadline is None else self.deadline - time.monotonic()
        try:
            async for piece in self.engine.stream(self._ids, self.params, self.answer, left):
                yield piece
        except DeadlineExceeded:
            self.stopped = True
        self._over = True

    def cancel(self) -> None:
        """Stop it at the engine's next step (nothing once it is over; the reader leaving cancels it too)."""
        if not self._over:
            self.stopped, self._over = True, True
            self.engine.cancel(self.answer.request_id)

    @property
    def prompt_tokens(self) -> int:
        return self.answer.prompt_tokens

    @property
    def logprobs(self) -> list | None:
        return self.answer.logprobs

    @property
    def new_tokens(self) -> int:
        return self.answer.new_tokens

    @property
    def finished(self) -> bool:
        return self.answer.finished
