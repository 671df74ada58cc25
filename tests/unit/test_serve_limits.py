"""What one `serve` request may ask (infer/limits.py), without Ray: every malformed or out-of-range body is a
RequestError naming the field (never a silent default), a body past the limit is refused before the rest is read,
and a streamed answer's generation really stops at its deadline or on cancel (issue 36)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from starlette.requests import Request

from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.infer.limits import RequestError, ServeLimits, parse_chat, read_body

LIMITS = ServeLimits(max_tokens_limit=100, default_max_tokens=16, max_n=2)
USER = [{"role": "user", "content": "头痛怎么办？"}]


def parse(body) -> object:
    return parse_chat(body if isinstance(body, bytes) else json.dumps(body).encode(), LIMITS)


def test_a_good_request_and_its_defaults():
    req = parse({"model": "sft", "messages": USER})
    assert req.turns == USER and req.n == 1 and not req.stream
    assert req.params == GenerationParams(max_new_tokens=16, temperature=0.0, top_p=1.0, seed=None)
    req = parse({"messages": USER, "temperature": 1, "seed": 42, "top_k": 20, "repetition_penalty": 1.1})
    assert (req.params.seed, req.params.top_k, req.params.repetition_penalty) == (42, 20, 1.1)
    req = parse({"messages": USER, "max_tokens": 100, "temperature": 0.7, "top_p": 0.9, "n": 2, "stream": True})
    assert (req.params.max_new_tokens, req.params.temperature, req.params.top_p, req.n, req.stream) == (
        100, 0.7, 0.9, 2, True)
    assert parse({"messages": USER, "max_completion_tokens": 5}).params.max_new_tokens == 5  # OpenAI's newer name
    # what asks for nothing is taken as the clients send it: no tools, text, no penalties, the client's own records
    quiet = parse({"messages": USER, "tools": [], "tool_choice": "none", "logprobs": False, "presence_penalty": 0,
                   "frequency_penalty": 0.0, "logit_bias": {}, "response_format": {"type": "text"}, "user": "u-1",
                   "metadata": {"ward": "3"}, "model": "sft"})
    assert quiet.params == GenerationParams(max_new_tokens=16, seed=None) and quiet.model == "sft"
    # OpenAI's penalties and logit_bias are read (the slots honour them; generate's engines refuse them by name)
    req = parse({"messages": USER, "presence_penalty": 0.5, "frequency_penalty": -1, "logit_bias": {"7": -100,
                                                                                                   "3": 2.5}})
    assert (req.params.presence_penalty, req.params.frequency_penalty) == (0.5, -1.0)
    assert req.params.logit_bias == ((3, 2.5), (7, -100.0)) and req.params.generate_cannot() == "presence_penalty"
    assert parse({"messages": USER, "logprobs": True, "top_logprobs": 4}).params.logprobs == 4
    assert parse({"messages": USER, "logprobs": True}).params.logprobs == 0
    assert parse({"messages": USER, "logprobs": False, "top_logprobs": 0}).params.logprobs is None


@pytest.mark.parametrize("body, field", [
    (b"{not json", "body"), (b"\xff\xfe", "body"), (b"[" * 100_000, "body"), (b'{"n": ' + b"9" * 5000 + b"}", "body"),
    (b"[1,2,3]", "body"), (b"null", "body"), (b'"hi"', "body"),
    ({}, "messages"), ({"messages": "hi"}, "messages"), ({"messages": []}, "messages"),
    ({"messages": [5]}, "messages[0]"), ({"messages": [{"role": "doctor", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": USER + [{"role": "assistant", "content": "y"}]}, "messages"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"), ({"messages": USER, "max_tokens": -5}, "max_tokens"),
    ({"messages": USER, "max_tokens": 1_000_000_000}, "max_tokens"),
    ({"messages": USER, "max_tokens": 101}, "max_tokens"),
    ({"messages": USER, "max_tokens": 8.5}, "max_tokens"), ({"messages": USER, "max_tokens": "8"}, "max_tokens"),
    ({"messages": USER, "max_tokens": True}, "max_tokens"),
    ({"messages": USER, "max_tokens": 5, "max_completion_tokens": 6}, "max_tokens"),
    ({"messages": USER, "temperature": -1}, "temperature"), ({"messages": USER, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "temperature": 2.5}, "temperature"),
    ({"messages": USER, "top_p": 5}, "top_p"), ({"messages": USER, "top_p": 0}, "top_p"),
    ({"messages": USER, "top_p": [1]}, "top_p"),
    ({"messages": USER, "n": 0}, "n"), ({"messages": USER, "n": 3}, "n"), ({"messages": USER, "n": "2"}, "n"),
    ({"messages": USER, "stream": "yes"}, "stream"), ({"messages": USER, "model": 7}, "model"),
    (b'{"messages": [{"role": "user", "content": "ok \\udc00"}]}', "messages[0].content"),
    ({"messages": USER, "tools": [{"type": "function"}]}, "tools[0]"), ({"messages": USER, "tools": {}}, "tools"),
    ({"messages": USER, "tool_choice": "required"}, "tool_choice"),
    ({"messages": USER, "functions": [{"name": "f"}]}, "functions"),
    ({"messages": USER, "logprobs": "yes"}, "logprobs"),
    ({"messages": USER, "top_logprobs": 3}, "top_logprobs"),
    ({"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": USER, "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": USER, "presence_penalty": 2.5}, "presence_penalty"),
    ({"messages": USER, "frequency_penalty": "-1"}, "frequency_penalty"),
    ({"messages": USER, "logit_bias": {"50256": -101}}, "logit_bias"),
    ({"messages": USER, "logit_bias": {"token": 1}}, "logit_bias"),
    ({"messages": USER, "logit_bias": [1, 2]}, "logit_bias"),
    ({"messages": USER, "logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    ({"messages": USER, "max_tokenz": 5}, "max_tokenz"), ({"messages": USER, "stop": 5}, "stop"),
    ({"messages": USER, "seed": -1}, "seed"), ({"messages": USER, "seed": 1.5}, "seed"),
    ({"messages": USER, "seed": 2**63}, "seed"), ({"messages": USER, "top_k": -1}, "top_k"),
    ({"messages": USER, "top_k": "5"}, "top_k"), ({"messages": USER, "repetition_penalty": 0}, "repetition_penalty"),
])
def test_every_bad_body_names_its_field(body, field):
    with pytest.raises(RequestError) as e:
        parse(body)
    assert e.value.field == field and e.value.status == 400 and str(e.value).startswith(f"{field}: ")


def test_nan_and_infinity_are_not_numbers():
    for text in (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
                 b'{"messages": [{"role": "user", "content": "x"}], "top_p": Infinity}'):
        with pytest.raises(RequestError, match="a number is required"):
            parse(text)


def test_the_limits_themselves_are_checked_and_fit_the_context():
    with pytest.raises(ValueError, match="over the ceiling"):
        ServeLimits(max_tokens_limit=100, default_max_tokens=200)
    with pytest.raises(ValueError, match="request_timeout_s"):
        ServeLimits(request_timeout_s=0)
    small = ServeLimits(max_tokens_limit=4096, default_max_tokens=512).for_context(300)
    assert (small.max_tokens_limit, small.default_max_tokens) == (299, 299)
    assert small.prompt_limit(100, 300) == 200
    assert ServeLimits(max_prompt_tokens=50).prompt_limit(100, 300) == 50


def request(chunks: list[bytes], headers: dict[str, str]) -> tuple[Request, list[int]]:
    """A real Starlette request whose body arrives in `chunks`; the list counts the chunks the server pulled."""
    pulled = [0]

    async def receive():
        i = pulled[0]
        pulled[0] += 1
        return {"type": "http.request", "body": chunks[i], "more_body": i + 1 < len(chunks)}

    scope = {"type": "http", "method": "POST", "path": "/", "query_string": b"",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    return Request(scope, receive), pulled


def test_a_body_past_the_limit_is_refused_unread():
    chunks = [b"x" * 65536] * 160  # 10 MiB
    req, pulled = request(chunks, {"content-length": str(10 << 20)})
    with pytest.raises(RequestError) as e:
        asyncio.run(read_body(req, 1 << 20))
    assert e.value.status == 413 and pulled[0] == 0  # refused on its Content-Length alone
    req, pulled = request(chunks, {"transfer-encoding": "chunked"})
    with pytest.raises(RequestError) as e:
        asyncio.run(read_body(req, 1 << 20))
    assert e.value.status == 413 and pulled[0] == 17  # stopped at the first chunk past 1 MiB
    req, _ = request([b'{"a": ', b"1}"], {})
    assert asyncio.run(read_body(req, 1 << 20)) == b'{"a": 1}'
    with pytest.raises(RequestError, match="Content-Length"):
        asyncio.run(read_body(request([b""], {"content-length": "-1"})[0], 100))


def test_generation_stops_at_its_deadline_and_on_cancel(tiny_model):
    from medgpt_ray.generation.engine import Generator
    from medgpt_ray.generation.stream import PromptTooLong, StreamedAnswer

    gen = Generator(str(tiny_model), "chatml", GenerationParams().as_dict())
    long = GenerationParams(max_new_tokens=2000)  # the tiny model never stops on its own: ~10 s of CPU
    t0 = time.monotonic()
    answer = StreamedAnswer(gen, USER, None, long, deadline=t0 + 0.5)
    "".join(answer)
    assert answer.wait(0) and time.monotonic() - t0 < 2.0
    assert answer.stopped and not answer.finished and 0 < answer.new_tokens < 2000
    answer = StreamedAnswer(gen, USER, None, long)
    next(iter(answer))
    answer.cancel()
    assert answer.wait(1.0) and answer.stopped
    with pytest.raises(PromptTooLong):
        StreamedAnswer(gen, USER, None, long, max_prompt_tokens=3)
    with pytest.raises(PromptTooLong) as e:  # a 1 MiB prompt is known to be too long from its start alone
        StreamedAnswer(gen, [{"role": "user", "content": "头痛" * 170_000}], None, long, max_prompt_tokens=100)
    assert e.value.at_least
    short = StreamedAnswer(gen, USER, None, GenerationParams(max_new_tokens=3))
    "".join(short)
    short.cancel()  # after the end: harmless, and not a stop
    assert short.new_tokens <= 3 and not short.stopped


@pytest.mark.parametrize("kwargs", [{"max_new_tokens": 0}, {"max_new_tokens": -5}, {"temperature": -1.0},
                                    {"top_p": 5.0}, {"top_p": 0.0}, {"temperature": float("nan")}])
def test_generation_params_refuse_nonsense(kwargs):
    with pytest.raises(ValueError):
        GenerationParams(**kwargs)


def serve_args(*argv: str):
    from medgpt_ray.cli.args import OneLineParser
    from medgpt_ray.cli.serve import add_serve_args

    p = OneLineParser(prog="medgpt-ray serve")
    add_serve_args(p)
    return p.parse_args(["--model", "m", *argv])


def test_the_cli_limits_and_where_the_log_goes(tmp_path, monkeypatch, capsys):
    from medgpt_ray.cli.serve import _limits, run_serve, serve_log_file

    assert _limits(serve_args()) == ServeLimits()  # the flags' defaults are the documented ones
    limits = _limits(serve_args("--max-body-bytes", "4096", "--max-tokens-limit", "64", "--max-new-tokens", "32",
                                "--max-prompt-tokens", "100", "--max-n", "1", "--request-timeout", "9.5",
                                "--stream-interval", "1"))
    assert limits == ServeLimits(4096, 100, 64, 32, 1, 9.5, stream_interval=1)
    with pytest.raises(SystemExit) as e:
        serve_args("--max-tokens-limit", "0")
    assert e.value.code == 2
    monkeypatch.setenv("MEDGPT_RAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert serve_log_file(serve_args("--port", "8123")) == tmp_path / "cache" / "serve-8123.log"  # not the cwd
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    bad = serve_args("--template", "chatml", "--max-new-tokens", "600", "--max-tokens-limit", "512")
    bad.model = str(model)
    assert run_serve(bad) == 2 and "over the ceiling 512" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.log"))
