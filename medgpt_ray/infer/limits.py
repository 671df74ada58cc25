"""What one request to `serve` may ask, and the request as the server reads it: the body's size (refused before it is
read past the limit), the chat messages, and max_tokens, temperature, top_p, n, stream within bounds. Anything else is
a RequestError naming the field (400, or 413 for the size): a hostile or careless client gets a sentence, never a 500,
and can neither make a replica read an unbounded body nor generate without end. Ray-free: unit tests drive it."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any

from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.infer.tool_calls import ToolRequestError, request_tools, tool_turn

ROLES = ("system", "user", "assistant")
MAX_TOP_K = 1_000_000  # past any vocabulary: the whole vocabulary


class RequestError(ValueError):
    """A request the server refuses: the HTTP status, the field at fault and a sentence for the client."""

    def __init__(self, field: str, message: str, status: int = 400):
        super().__init__(f"{field}: {message}")
        self.field, self.status = field, status


@dataclass(frozen=True)
class ServeLimits:
    max_body_bytes: int = 1 << 20  # 1 MiB: about 300k Chinese characters, far past any context we serve
    max_prompt_tokens: int | None = None  # None: the model's context minus the request's max_tokens
    max_tokens_limit: int = 2048  # the ceiling on a request's max_tokens (also kept below the model's context)
    default_max_tokens: int = 512  # a request that names no max_tokens
    max_n: int = 4  # choices per request
    request_timeout_s: float = 120.0  # past it a request is cancelled: its generation stops, its slot is freed
    max_concurrent: int = 32  # requests a replica takes at once (Serve's max_ongoing_requests; the page pool's size)
    # New tokens a streamed piece holds after the first (RequestEngine.stream_interval). 4: 32 streaming clients on a
    # 1.5B (H100) got 4,198 tokens/s at 4 against 2,927 at 1 (bench/results/serve_load_1.5b_h100_slots_{1,4}.json);
    # about 30 ms between a client's pieces at that rate.
    stream_interval: int = 4

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_tokens_limit", "default_max_tokens", "max_n", "max_concurrent",
                     "stream_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)}: must be >= 1")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens {self.max_prompt_tokens}: must be >= 1")
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(f"the default max_tokens {self.default_max_tokens} (--max-new-tokens) is over the ceiling "
                             f"{self.max_tokens_limit} (--max-tokens-limit); lower the one or raise the other")
        if not (math.isfinite(self.request_timeout_s) and self.request_timeout_s > 0):
            raise ValueError(f"request_timeout_s {self.request_timeout_s}: a number of seconds > 0 is required")

    def for_context(self, context: int | None) -> ServeLimits:
        """These limits for a model that reads `context` tokens: a completion leaves room for a prompt token."""
        if context is None or self.max_tokens_limit < context:
            return self
        ceiling = max(1, context - 1)
        return replace(self, max_tokens_limit=ceiling, default_max_tokens=min(self.default_max_tokens, ceiling))

    def prompt_limit(self, max_tokens: int, context: int | None) -> int:
        """The most prompt tokens a request with this max_tokens may bring."""
        room = context - max_tokens if context is not None else None
        limits = [n for n in (room, self.max_prompt_tokens) if n is not None]
        return max(0, min(limits)) if limits else 1 << 62


@dataclass(frozen=True)
class ChatRequest:
    turns: list[dict]
    params: GenerationParams
    n: int = 1
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage (OpenAI's)
    stop: tuple[str, ...] = ()  # OpenAI's stop strings (generation/stop_text.py)
    model: str | None = None  # the model the client named (the server answers for its own only)
    tools: list[dict] | None = None  # OpenAI's tools, rendered by the chat template (infer/tool_calls.py)


async def read_body(request: Any, max_bytes: int) -> bytes:
    """The body of a Starlette request, refused (413) past `max_bytes` before more of it is read: by its declared
    Content-Length when there is one, else as soon as the chunks received so far pass the limit."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise RequestError("Content-Length", f"{declared[:40]!r} is not a byte count")
        if int(declared) > max_bytes:
            raise RequestError("body", f"{int(declared)} bytes is over this server's limit of {max_bytes}", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise RequestError("body", f"more than this server's limit of {max_bytes} bytes", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict, field: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(field, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError(field, f"a number is required, not {json.dumps(value)[:40]}")
    if value < low or (low_open and value == low) or value > high:
        raise RequestError(field, f"{value} is out of range: {'(' if low_open else '['}{low:g}, {high:g}]")
    return float(value)


def _bounded_int(body: dict, field: str, default: int, high: int) -> int:
    value = body.get(field)
    if value is None:  # absent or null: the documented default, as OpenAI's API reads it
        return default
    if not _is_int(value):
        raise RequestError(field, f"an integer is required, not {json.dumps(value)[:40]}")
    if not 1 <= value <= high:
        raise RequestError(field, f"{value} is out of range: 1 to {high} on this server")
    return value


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages", "a non-empty list is required")
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}]", "an object with role and content is required")
        try:
            tool = tool_turn(i, m)  # an assistant's tool_calls, a tool's result: turns of the tool protocol
        except ToolRequestError as e:
            raise RequestError(e.field, str(e)) from None
        if tool is not None:
            if _unpaired_surrogate(tool["content"]):
                raise RequestError(f"messages[{i}]", "not valid Unicode text (an unpaired surrogate)")
            turns.append(tool)
            continue
        if m.get("role") not in ROLES:
            raise RequestError(f"messages[{i}].role", f"one of {', '.join(ROLES)} is required")
        if not isinstance(m.get("content"), str):
            raise RequestError(f"messages[{i}].content", "a string is required")
        if not m["content"].isascii() and _unpaired_surrogate(m["content"]):
            raise RequestError(f"messages[{i}].content", "not valid Unicode text (an unpaired surrogate such as "
                                                         "\\ud800)")
        turns.append({"role": m["role"], "content": m["content"]})
    if turns[-1]["role"] not in ("user", "tool"):
        raise RequestError("messages", "the last message must be the user's (or a tool's result)")
    return turns


def _unpaired_surrogate(text: str) -> bool:
    """Whether `text` holds a surrogate code point, which JSON's \\ud800 escapes can give and no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# The body's fields this server reads (parse_chat), and those it takes as OpenAI's clients send them because they
# change nothing here (`user`, `metadata`: for the client's own records; `store`, `service_tier`: OpenAI's platform).
READ = {"messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
        "stream_options", "stop", "seed", "top_k", "repetition_penalty", "presence_penalty", "frequency_penalty",
        "logit_bias", "logprobs", "top_logprobs", "tools", "tool_choice"}
INERT = {"user", "metadata", "store", "service_tier", "parallel_tool_calls"}
# OpenAI's fields this server cannot honour: why, and the values that ask for nothing (sent as they are, taken).
LEGACY = "OpenAI's deprecated function calling: send tools and tool_choice instead"
UNHONOURED: dict[str, tuple[str, tuple]] = {
    "functions": (LEGACY, (None, [])), "function_call": (LEGACY, (None, "none")),
    "response_format": ("this server does not constrain the answer's format (only {\"type\": \"text\"})",
                        (None, {"type": "text"}))}
MAX_LOGIT_BIAS = 300  # OpenAI's limit on the tokens one request biases


def _no_silent_fields(body: dict) -> None:
    """A field this server would not honour is refused, never ignored: OpenAI's it cannot (tools, logprobs...) unless
    it asks for nothing, and any it does not know (OpenAI's API refuses those too)."""
    for field, (why, neutral) in UNHONOURED.items():
        if field in body and not any(body[field] == v and type(body[field]) is type(v) for v in neutral):
            raise RequestError(field, why)
    unknown = sorted(set(body) - READ - INERT - set(UNHONOURED))
    if unknown:
        raise RequestError(unknown[0], "not a field this server reads (it reads: " + ", ".join(sorted(READ)) + ")")


def _stops(body: dict) -> tuple[str, ...]:
    """OpenAI's `stop`: null, a string, or a list of up to MAX_STOPS strings; each non-empty and bounded."""
    from medgpt_ray.generation.stop_text import MAX_STOP_CHARS, MAX_STOPS

    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > MAX_STOPS:
        raise RequestError("stop", f"a string or a list of at most {MAX_STOPS} strings is required")
    if not all(0 < len(s) <= MAX_STOP_CHARS for s in stops):
        raise RequestError("stop", f"each stop string needs 1 to {MAX_STOP_CHARS} characters")
    return tuple(stops)


def _logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias`: null or {token id (a string of digits): bias in [-100, 100]}, at most MAX_LOGIT_BIAS;
    the ids are checked against the model's logits when the request is taken."""
    bias = body.get("logit_bias")
    if bias is None:
        return ()
    if not isinstance(bias, dict) or len(bias) > MAX_LOGIT_BIAS:
        raise RequestError("logit_bias", f"an object of at most {MAX_LOGIT_BIAS} token ids is required")
    out = []
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 9):
            raise RequestError("logit_bias", f"keys are token ids (strings of digits), not {json.dumps(key)[:40]}")
        if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
            raise RequestError("logit_bias", f"token {key}: a bias in [-100, 100] is required")
        out.append((int(key), float(value)))
    return tuple(sorted(out))


def _logprobs(body: dict) -> int | None:
    """OpenAI's `logprobs` (true: each token's log-probability) and `top_logprobs` (0-20 likeliest beside it, only
    with logprobs true); None where none is asked."""
    from medgpt_ray.generation.sampler import MAX_LOGPROBS

    asked, top = body.get("logprobs"), body.get("top_logprobs")
    if asked is not None and not isinstance(asked, bool):
        raise RequestError("logprobs", "true or false is required")
    if top is not None and not (_is_int(top) and 0 <= top <= MAX_LOGPROBS):
        raise RequestError("top_logprobs", f"an integer in [0, {MAX_LOGPROBS}] is required")
    if top and not asked:
        raise RequestError("top_logprobs", "needs logprobs: true")
    return (top or 0) if asked else None


def parse_chat(raw: bytes, limits: ServeLimits) -> ChatRequest:
    """A /v1/chat/completions body, read and bounded; RequestError (400) naming the field otherwise."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested past the stack, an int over 4300 digits
        raise RequestError("body", "not JSON (or past what JSON this server reads)") from None
    if not isinstance(body, dict):
        raise RequestError("body", f"a JSON object is required, not a JSON {type(body).__name__}")
    turns = _messages(body)
    _no_silent_fields(body)
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise RequestError("max_tokens", "give max_tokens or max_completion_tokens, not both")
    field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _bounded_int(body, field, limits.default_max_tokens, limits.max_tokens_limit)
    temperature = _number(body, "temperature", 0.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    n = _bounded_int(body, "n", 1, limits.max_n)
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise RequestError("stream", "true or false is required")
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise RequestError("model", "a string is required")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise RequestError("stream_options", 'an object such as {"include_usage": true} is required')
    seed = body.get("seed")
    if seed is not None and not (_is_int(seed) and 0 <= seed < 2**63):
        raise RequestError("seed", f"an integer in [0, 2^63) is required, not {json.dumps(seed)[:40]}")
    top_k = body.get("top_k", 0)  # top_k and repetition_penalty: vLLM's extensions of OpenAI's body
    if top_k is not None and not (_is_int(top_k) and 0 <= top_k <= MAX_TOP_K):
        raise RequestError("top_k", f"an integer in [0, {MAX_TOP_K}] is required (0: off), not "
                                    f"{json.dumps(top_k)[:40]}")
    penalty = _number(body, "repetition_penalty", 1.0, 0.0, 2.0, low_open=True)
    params = GenerationParams(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed,
                              top_k=top_k or 0, repetition_penalty=penalty,
                              presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
                              frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
                              logit_bias=_logit_bias(body), logprobs=_logprobs(body))
    try:
        tools = request_tools(body)
    except ToolRequestError as e:
        raise RequestError(e.field, str(e)) from None
    return ChatRequest(turns, params, n, bool(stream), bool(options.get("include_usage")), _stops(body),
                       body.get("model"), tools)
