"""The decoding of one conversation (`chat`): every answer of the session generated on one thread of its own, on the
decode path the Generator chose at load (generation/decode_path.py: static on a GPU, dynamic on the CPU and for a
model with linear-attention layers, unless `--generation-path` says).

On the static path one StaticDecoder (batch 1) serves every turn: its cache is made by the first answer and reset
for each next one, so the decode step transformers compiles (CUDA graphs on CUDA) is replayed turn after turn
instead of paying Python and a kernel launch per op for every token. One thread for all of it, because torch keeps
its CUDA-graph trees per thread: a graph recorded in one thread and replayed from another asserts or silently reads
the wrong memory (pytorch/pytorch#123177), and a new thread per answer would record the graphs anew.

The cache's length: the first answer's prompt + max_new_tokens rounded up to a power of two, CACHE_FLOOR at least;
a conversation that outgrows it gets one twice as long (or as long as it needs), a new cache and a new compiled step
(`builds` counts the caches). Many concurrent requests (serve's fallback) cannot share one batch-1 cache: they
decode without a session, each on the dynamic path in a thread of its own (generation/stream.py)."""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

from medgpt_ray.generation.decode_path import STATIC, StaticDecoder
from medgpt_ray.generation.engine import Generator

CACHE_FLOOR = 2048  # the static cache's least length (tokens): a few turns of a chat before it grows
STOP_WAIT_S = 30.0  # how long the end of a session (or of the process) waits for its answer in progress


def cache_length(need: int, before: int = 0) -> int:
    """The static cache's length for `need` tokens (prompt + new ones): a power of two, CACHE_FLOOR at least, twice
    a previous cache's length `before` at least (it grew: the conversation goes on)."""
    return max(CACHE_FLOOR, 1 << max(need - 1, 0).bit_length(), 2 * before)


class DecodeSession:
    """One conversation's decoding: the Generator's path, one thread that runs its answers in turn (submit), and on
    the static path its StaticDecoder (`decoder`, made by the first answer). close() ends the thread (also done
    when the session is collected, and at exit)."""

    def __init__(self, gen: Generator):
        self.gen, self.path = gen, gen.path
        self.decoder: StaticDecoder | None = None
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        thread = threading.Thread(target=_run_jobs, args=(self._jobs,), daemon=True, name="decode-session")
        thread.start()
        # Ended when the session is collected or, at the latest, when the process exits: a thread that has run torch
        # and is still alive while the interpreter finalizes can abort it ("terminate called without an active
        # exception", seen in the chat CLI's test).
        self.close = weakref.finalize(self, _stop, self._jobs, thread)

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` on the session's thread, after the jobs submitted before it."""
        self._jobs.put(job)

    def generate(self, input_ids: Any, **kwargs: Any) -> Any:
        """The model's generate on the session's path; called on the session's thread (a job's)."""
        if self.path.name != STATIC:
            return self.gen.model.generate(input_ids=input_ids, **kwargs)
        need = input_ids.shape[1] + kwargs["max_new_tokens"]
        if self.decoder is None:
            self.decoder = StaticDecoder(cache_length(need), self.gen.compile_config)
        elif need > self.decoder.max_len:
            self.decoder.resize(cache_length(need, self.decoder.max_len))
        return self.decoder.generate(self.gen.model, input_ids, **kwargs)


def _run_jobs(jobs: queue.SimpleQueue) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        job()  # a job reports its own errors (StreamedAnswer._run): the thread outlives them
        del job  # nor does the thread keep the session alive through its last job while it waits


def _stop(jobs: queue.SimpleQueue, thread: threading.Thread) -> None:
    """The session's thread ends after the jobs before (an answer cancelled by its reader stops at its next token)."""
    jobs.put(None)
    thread.join(STOP_WAIT_S)
