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
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if found:
            self.hit, self._held = True, ""
            return text[:min(found)]
        keep = max((k for s in self.stops for k in range(1, min(len(s), len(text) + 1))
                    if text.endswith(s[:k])), default=0)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        """The text held back at the end of an answer that hit no stop string."""
        held, self._held = ("" if self.hit else self._held), ""
        return held
