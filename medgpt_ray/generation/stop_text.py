"""OpenAI's `stop`: up to four strings; the answer ends before the first of them that appears in its text, which is
not returned, and finishes with "stop". Matched on the decoded text as it streams (as OpenAI and vLLM do), so a stop
string split across tokens or pieces is still found; a piece's tail that could be the start of a stop string is held
back until the next piece says whether it is one, so no part of a stop string is ever sent."""

from __future__ import annotations

from collections.abc import Sequence

MAX_STOPS = 4  # OpenAI's limit
MAX_STOP_CHARS = 256  # one stop string's length, at most (bounded work a piece)


class StopText:
    """Feed an answer's pieces in order; `feed` returns what may be sent now, `flush` what remains at the end; `hit`
    once a stop string was found (nothing after it is returned)."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.hit = False
        self._held = ""

    def feed(self, piece: str) -> str:
        if self.hit or not self.stops:
            return "" if self.hit else piece
        text = self._held + piece
        found = self._first(text)
        # where a stop string may begin that the next pieces could still complete: a match there would come first
        open_at = min((j for j in range(max(0, len(text) - max(map(len, self.stops)) + 1), len(text))
                       if any(len(s) > len(text) - j and s.startswith(text[j:]) for s in self.stops)), default=None)
        if found is not None and (open_at is None or found <= open_at):
            self.hit, self._held = True, ""
            return text[:found]
        cut = len(text) if open_at is None else open_at
        self._held = text[cut:]
        return text[:cut]

    def flush(self) -> str:
        """The text held back at the end of an answer: up to a stop string in it, if one is."""
        held, self._held = ("" if self.hit else self._held), ""
        found = self._first(held)
        if found is not None:
            self.hit = True
            return held[:found]
        return held

    def _first(self, text: str) -> int | None:
        """Where the first stop string in `text` begins (None: none is in it)."""
        return min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=None)
