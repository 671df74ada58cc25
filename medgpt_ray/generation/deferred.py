"""What the static decode loop (generation/decode_loop.py) learns from the GPU without waiting for it: device values
copied to pinned host memory with an event recorded behind the copy, read once the event has passed, a step or so
after. transformers' own DeferredStopCheck does this on MPS; its CUDA loop reads every step. The host waits only to
stay at most DeferredFlags.AHEAD steps in front of the GPU. On the CPU a copy is the value at once, so the loop
there behaves step for step as generate does."""

from __future__ import annotations

from collections import deque
from typing import Any


class _Copies:
    """Device tensors copied to the host without waiting, each with the event behind its copy (none on the CPU)."""

    def __init__(self, device: Any):
        self.cuda = device.type == "cuda"

    def copy(self, value: Any) -> tuple[Any, Any]:
        import torch

        host = torch.empty(value.shape, dtype=value.dtype, pin_memory=self.cuda)
        host.copy_(value, non_blocking=True)
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record()
        return host, event


class DeferredFlags(_Copies):
    """"Every row has stopped" and "a probability was refused", as of the latest step the GPU has carried out. The
    host runs at most AHEAD steps in front of the GPU (a push waits for the one AHEAD before it): enough to keep
    the GPU fed, and a stop is learnt at most that many steps late."""

    AHEAD = 3

    def __init__(self, device: Any):
        super().__init__(device)
        self.pushed: deque[tuple[Any, Any]] = deque()
        self.settled: Any = None  # the last push waited for (done)

    def push(self, unfinished: Any, bad: Any) -> None:
        import torch

        self.pushed.append(self.copy(torch.stack([~unfinished.any(), bad])))
        if len(self.pushed) > self.AHEAD:
            self.settled, event = self.pushed.popleft()
            if event is not None:
                event.synchronize()

    def read(self) -> tuple[bool, bool]:
        """(every row stopped, a probability refused) as of the latest push the GPU has done; (False, False) while
        it has done none of those held (both only ever turn true, so an older one is a true answer, only later)."""
        done = next((host for host, event in reversed(self.pushed) if event is None or event.query()), self.settled)
        if done is None:
            return False, False
        every_row, bad = done.tolist()
        return bool(every_row), bool(bad)


class DeferredStream(_Copies):
    """A transformers streamer (batch of one) fed each token once the GPU has produced it, in order, never waiting
    until `close`; a token drawn after its row stopped (the loop learns of the stop a step or so late) is not fed."""

    def __init__(self, streamer: Any, device: Any):
        super().__init__(device)
        self.streamer, self.pending = streamer, deque()

    def push(self, token: Any, running: Any) -> None:
        """`token` ([1]) and whether its row was still running when it was drawn ([1] bool)."""
        import torch

        self.pending.append(self.copy(torch.stack([token, running.long()], dim=1)))
        self.feed(wait=False)

    def feed(self, wait: bool) -> None:
        while self.pending and (wait or self.pending[0][1] is None or self.pending[0][1].query()):
            host, event = self.pending.popleft()
            if event is not None:
                event.synchronize()
            token, running = host[0].tolist()
            if running:
                self.streamer.put(host[:, 0])

    def close(self) -> None:
        """Every token fed (this waits for the GPU), then the streamer's end."""
        self.feed(wait=True)
        self.streamer.end()


class DeferredTokens(_Copies):
    """The slot engine's tokens of each step, each with whom its rows belonged to when it ran, handed to the host a
    step late: the GPU runs the next step while the last one's tokens are read and handed out."""

    def __init__(self, device: Any):
        super().__init__(device)
        self.pending: deque[tuple[Any, Any, dict]] = deque()

    def push(self, tokens: Any, owners: dict, extra: tuple | None = None) -> None:
        """`extra`: more device tensors of the step (the sampler's log-probabilities), copied behind the tokens."""
        copies = None if extra is None else [self.copy(t)[0] for t in extra]
        self.pending.append((*self.copy(tokens), owners, copies))

    def settle(self, keep: int) -> list[tuple[list[int], dict, list | None]]:
        """The steps pushed before the last `keep`, oldest first: (their tokens, their owners, their extra tensors
        as lists or None), waited for."""
        out = []
        while len(self.pending) > keep:
            host, event, owners, extra = self.pending.popleft()
            if event is not None:  # recorded after the extra copies' too
                event.synchronize()
            out.append((host.tolist(), owners, None if extra is None else [t.tolist() for t in extra]))
        return out
