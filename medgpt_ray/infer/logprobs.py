"""OpenAI's `logprobs` of a chat completion: per generated token its text, log-probability and UTF-8 bytes, and the
`top_logprobs` likeliest tokens at that step, from what the slot engine's sampler read (the model's own distribution:
log-softmax of its logits, before penalties, bias and temperature)."""

from __future__ import annotations

from typing import Any


def _token(tok: Any, token_id: int, logprob: float) -> dict[str, Any]:
    text = tok.decode([token_id])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def content(tok: Any, logprobs: list | None, start: int, end: int) -> list[dict[str, Any]]:
    """The entries of generated tokens [start, end) (OpenAI's `choices[i].logprobs.content`)."""
    return [{**_token(tok, token_id, chosen), "top_logprobs": [_token(tok, i, v) for i, v in top]}
            for token_id, chosen, top in (logprobs or [])[start:end]]


class LogprobCursor:
    """A streamed answer's logprobs, chunk by chunk: each chunk carries the tokens whose text it completes."""

    def __init__(self, tok: Any, asked: bool):
        self.tok, self.asked, self.sent = tok, asked, 0

    def next(self, answer: Any) -> dict[str, Any]:
        """The chunk's `logprobs` field (empty where none was asked): the answer's tokens since the last chunk, up to
        those its text holds so far."""
        if not self.asked:
            return {}
        end = min(answer.new_tokens, len(answer.logprobs or []))
        entries, self.sent = content(self.tok, answer.logprobs, self.sent, end), max(self.sent, end)
        return {"logprobs": {"content": entries}}
