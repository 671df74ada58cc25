"""Continuous batching on the static cache (`serve --engine slots`): requests join the running batch between decode
steps and leave it when they stop, as in transformers' engine, but every step is the static path's one compiled
decode step (CUDA graphs on a GPU) over a fixed batch of slots (generation/slot_cache.py), each request sampled with
its own settings and seed by the one sampler (generation/sampler.py).

One thread owns the model: between two steps it frees the rows of finished and cancelled requests, prefills the
waiting ones that have a free row (one eager forward for all of them, left-padded), takes their first tokens and
places their K and V in their rows; then it runs one step for every row and hands each request its token on the
event loop that asked (a free row's token is dropped). The tokens are read back every step, which waits for the GPU
once a step: streaming needs them. A request that could never fit a row (prompt + max_new_tokens past the cache's
length less one) is answered with an error; the serving layer refuses such prompts before (`request_room`)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from medgpt_ray.generation import decode_loop
from medgpt_ray.generation.continuous import PoolLimits, RequestEngine
from medgpt_ray.generation.decode_path import cache_kwarg, free_device_bytes
from medgpt_ray.generation.deferred import DeferredTokens
from medgpt_ray.generation.engine import Generator
from medgpt_ray.generation.packed_gqa import packed_gqa_decoding
from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.generation.sampler import Sampler
from medgpt_ray.generation.slot_cache import SlotCache, slot_length, slot_unsupported_reason

log = logging.getLogger(__name__)
WARM_STEPS = 3  # compiled decode steps run before the first request: compilation, then CUDA graph trees' recording
# A request's prompt room where the server sets no --max-prompt-tokens: every decode step reads every column of the
# slot cache (masked or not), so its length is sized to the requests served, not to the model's context.
PROMPT_TOKENS = 1024


@dataclass
class SlotOutput:
    """A request's tokens so far, as transformers' engine hands them out (RequestEngine.stream reads either)."""

    generated_tokens: list[int]
    error: str | None = None
    finished: bool = False
    # A request that asked for logprobs: per generated token (its id, its log-probability, [(token id,
    # log-probability)] of the likeliest top_logprobs); None otherwise.
    logprobs: list | None = None

    def is_finished(self) -> bool:
        return self.finished or self.error is not None


@dataclass
class _Request:
    request_id: str
    prompt_ids: list[int]
    params: GenerationParams
    loop: asyncio.AbstractEventLoop
    on_output: Any
    tokens: list[int] = field(default_factory=list)
    logprobs: list | None = None  # as SlotOutput's, filled where params.logprobs asks

    def deliver(self, out: SlotOutput) -> bool:
        """Hand `out` to the request's event loop; False when that loop is closed (nobody reads any more)."""
        try:
            self.loop.call_soon_threadsafe(self.on_output, out)
        except RuntimeError:
            return False
        return True


class SlotEngine(RequestEngine):
    """One model's slot engine (a serve replica's): `limits.requests` rows, started once, answered from any number
    of concurrent requests on their callers' event loops. `compile_config`: transformers' CompileConfig for the
    decode step (None: on CUDA the static path's, CUDA graphs; on the CPU no compilation)."""

    def __init__(self, gen: Generator, limits: PoolLimits, compile_config: Any = None, memory_room: int | None = None):
        import torch

        from medgpt_ray.generation.decode_path import static_compile_config

        reason = slot_unsupported_reason(gen.model.config)
        if reason is not None:
            raise ValueError(f"the slot engine cannot run this model: {reason}")
        self.gen, self.limits, self._ids = gen, limits, itertools.count()
        self.base = decode_loop.text_model(gen.model)
        device = next(self.base.parameters()).device
        # The engine owns the model: its decode steps attend without repeat_kv's copies for its whole life.
        self._attention = ExitStack()
        packed = self._attention.enter_context(packed_gqa_decoding(self.base))
        self.attention = "packed_gqa" if packed else "sdpa"
        room = memory_room if memory_room is not None else free_device_bytes(device.type)
        self.key = cache_kwarg(self.base)
        self.slots = SlotCache(self.base, limits.requests, slot_length(self.base, limits, room), self.key)
        self.request_room = self.slots.length - 1  # prompt + new tokens one request may hold
        compiled = compile_config is not None or device.type == "cuda"
        self.step = self.base.get_compiled_call(compile_config or static_compile_config()) if compiled else self.base
        rows = limits.requests
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        vocab = self.base.get_output_embeddings().weight.shape[0]
        self.sampler = Sampler(rows, vocab, device)
        self.rows: dict[int, _Request] = {}
        self.readback = DeferredTokens(device)
        self.pending: deque[_Request] = deque()
        self.admitting: list[_Request] = []
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.steps = 0  # decode steps run (a step serves every row at once)
        self._warm_steps = WARM_STEPS if compiled else 0
        self._ready, self._warm_error = threading.Event(), None
        self.thread = threading.Thread(target=self._run, daemon=True, name="slot-engine")
        self.thread.start()
        self._ready.wait()  # compiled and its graphs captured before the first request (a replica is ready then)
        if self._warm_error is not None:
            self.thread.join()
            self._attention.close()
            raise RuntimeError(f"the slot engine's decode step failed to warm up: {self._warm_error}")

    def unsupported(self, params: GenerationParams) -> str | None:
        return None  # the sampler takes every setting and seed per row

    def _start_request(self, request_id: str, prompt_ids: list[int], params: GenerationParams,
                       on_output: Any) -> None:
        self._inbox.put(_Request(request_id, list(prompt_ids), params, asyncio.get_running_loop(), on_output))

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._cancelled.add(request_id)
        self._inbox.put(None)  # wakes an idle engine

    def stop(self) -> None:
        self._stopping.set()
        self._inbox.put(None)
        self.thread.join()
        self._attention.close()

    def _warm(self) -> None:
        """The decode step run WARM_STEPS times on the free rows, in this thread (CUDA graph trees are per thread):
        compiled and captured here, replayed from the first request on."""
        try:
            for _ in range(self._warm_steps):
                self._step_logits()
            self.slots.clear()
        except Exception as e:  # handed to the constructor, which raises it
            self._warm_error = f"{type(e).__name__}: {e}"
            self._stopping.set()
        finally:
            self._ready.set()

    def _run(self) -> None:
        import torch

        with torch.no_grad():
            self._warm()
            while not self._stopping.is_set():
                try:
                    self._take_inbox(block=not self.rows and not self.pending)
                    self._drop_cancelled()
                    self._admit()
                    if self.rows:
                        self._decode_step()
                except Exception as e:  # every request in flight is told; the engine goes on with new ones
                    log.exception("slot engine step failed")
                    self._fail_all(f"{type(e).__name__}: {e}")

    def _take_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            while True:
                if item is not None:
                    self.pending.append(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            return

    def _drop_cancelled(self) -> None:
        with self._lock:
            cancelled, self._cancelled = self._cancelled, set()
        if cancelled:
            self.pending = deque(r for r in self.pending if r.request_id not in cancelled)
            for row, req in list(self.rows.items()):
                if req.request_id in cancelled:
                    self._free(row)

    def _free(self, row: int) -> None:
        del self.rows[row]
        self.slots.free(row)
        self.sampler.free(row)

    def _admit(self) -> None:
        """The waiting requests that have a free row: prefilled together, their first tokens handed out."""
        free = [r for r in range(self.limits.requests) if r not in self.rows]
        batch: list[_Request] = []
        while self.pending and len(batch) < len(free):
            req = self.pending.popleft()
            if len(req.prompt_ids) + req.params.max_new_tokens > self.request_room:
                req.deliver(SlotOutput([], error=f"{len(req.prompt_ids)} prompt tokens + {req.params.max_new_tokens} "
                                                 f"new ones exceed the {self.request_room} a slot holds"))
                continue
            batch.append(req)
        if not batch:
            return
        width = max(len(r.prompt_ids) for r in batch)
        if not self.rows:
            self.slots.restart()
        elif not self.slots.room(width):
            self.slots.compact()
        if not self.slots.room(width):  # the rows in flight hold too much: these wait for some to finish
            self.pending.extendleft(reversed(batch))
            return
        self.admitting = batch  # told of a failure too (_fail_all) until they hold their rows
        self._prefill(batch, free[:len(batch)], width)

    def _prefill(self, batch: list[_Request], rows: list[int], width: int) -> None:
        import torch
        from transformers import DynamicCache

        device = self.tokens.device
        ids = torch.tensor([[0] * (width - len(r.prompt_ids)) + r.prompt_ids for r in batch], device=device)
        mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in batch],
                            device=device)
        positions = decode_loop.prompt_positions(mask)
        prefill = DynamicCache(config=self.base.config.get_text_config(decoder=True))
        logits = self.base(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                           **{self.key: prefill}, **decode_loop.logits_to_keep(self.base)).logits
        index = torch.tensor(rows, device=device)
        self.sampler.take(rows, [r.params.settings() for r in batch], [r.prompt_ids for r in batch])
        first = self.sampler.draw(decode_loop.last_scores(logits), rows=rows)
        self.slots.place(rows, prefill, mask)
        self.tokens[index] = first
        self.positions[index] = mask.sum(-1)
        for row, req in zip(rows, batch, strict=True):
            self.rows[row] = req
        self.admitting = []
        lp = self.sampler.last_logprobs
        self._hand_out(dict(zip(rows, first.tolist(), strict=True)),
                       None if lp is None else dict(zip(rows, _rows_of([t.tolist() for t in lp]), strict=True)))

    def _step_logits(self) -> Any:
        """One decode step of every row (decode_loop.decode_step, the batch loop's): each row's float32 scores."""
        if self.slots.t >= self.slots.length:
            self.slots.compact()
        scores = decode_loop.decode_step(self.step, self.base, self.tokens[:, None], self.positions[:, None],
                                         self.slots.padding, self.key, self.slots.cache)
        self.slots.advance()
        return scores

    def _decode_step(self) -> None:
        following = self.sampler.draw(self._step_logits())
        self.tokens.copy_(following)
        self.positions += self.slots.active
        self.steps += 1
        self.readback.push(following, dict(self.rows), self.sampler.last_logprobs)
        for host, owners, lp in self.readback.settle(keep=1):  # the last step's, while the GPU runs this one
            live = [row for row, req in owners.items() if self.rows.get(row) is req]
            self._hand_out({row: host[row] for row in live},
                           None if lp is None else {row: _rows_of(lp)[row] for row in live})

    def _hand_out(self, tokens: dict[int, int], logprobs: dict[int, tuple] | None = None) -> None:
        """Each row's new token to its request (with its log-probabilities where it asked); a request that stopped
        (its stop token, its max_new_tokens) or whose reader's loop is gone gives its row back."""
        for row, token in tokens.items():
            req = self.rows[row]
            req.tokens.append(token)
            if req.params.logprobs is not None and logprobs is not None:
                chosen, values, ids = logprobs[row]
                req.logprobs = req.logprobs if req.logprobs is not None else []
                req.logprobs.append((token, chosen, list(zip(ids, values, strict=True))[:req.params.logprobs]))
            finished = token in self.gen.stops or len(req.tokens) >= req.params.max_new_tokens
            if finished:  # given back before the reader hears of it: a reader that finished sees its row free
                self._free(row)
            out = SlotOutput(list(req.tokens), finished=finished,
                             logprobs=None if req.logprobs is None else list(req.logprobs))
            if not req.deliver(out) and not finished:
                self._free(row)

    def _fail_all(self, error: str) -> None:
        held = {id(r) for r in self.rows.values()}
        for req in [*self.rows.values(), *(r for r in self.admitting if id(r) not in held), *self.pending]:
            req.deliver(SlotOutput(list(req.tokens), error=error))
        for row in list(self.rows):
            self._free(row)
        self.pending.clear()
        self.readback.pending.clear()
        self.admitting = []
        self.slots.clear()


def _rows_of(logprobs: list) -> list[tuple]:
    """The sampler's (chosen, top values, top ids) as host lists, row by row."""
    return list(zip(*logprobs, strict=True))
