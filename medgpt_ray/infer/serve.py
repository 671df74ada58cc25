"""An OpenAI-compatible endpoint on Ray Serve: GET /v1/models and POST /v1/chat/completions (streamed as server-sent
events, or whole), one model per replica (a GPU each where asked), the chat template the model was trained with.
Bound to loopback unless told otherwise; with an API key every request needs `Authorization: Bearer <key>`.
Every request is bounded (infer/limits.py): its body's size, its prompt, max_tokens, n and a deadline past which its
generation stops; generation runs in worker threads, so one long answer never blocks the replica's other requests.
(No `from __future__ import annotations`: FastAPI reads the handlers' annotations as types.)"""


import asyncio
import dataclasses
import hmac
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import jinja2
import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve

from medgpt_ray.generation.continuous import ContinuousAnswer
from medgpt_ray.generation.engine import Generator
from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.generation.stop_text import StopText
from medgpt_ray.generation.stream import PromptTooLong, StreamedAnswer
from medgpt_ray.infer.limits import ChatRequest, RequestError, ServeLimits, parse_chat, read_body
from medgpt_ray.infer.logprobs import LogprobCursor
from medgpt_ray.infer.logprobs import content as logprob_content
from medgpt_ray.infer.serve_engine import serving_path
from medgpt_ray.infer.source import ModelSource
from medgpt_ray.infer.tool_calls import CallHoldback, split_calls
from medgpt_ray.models import context_length
from medgpt_ray.templates.base import TemplateError
from medgpt_ray.tiny import use_compile_caches

app = FastAPI(title="medgpt-ray")


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    replicas: int = 1
    gpus_per_replica: float = 0.0
    cpus_per_replica: float = 1.0
    api_key: str | None = None
    name: str | None = None  # the model's name in /v1/models (default: the stage, else the directory's name)
    limits: ServeLimits = ServeLimits()
    verbose: bool = False
    engine: str = "auto"  # serve_engine.ENGINES
    # Seconds a kept-alive connection may sit idle after its answer before Serve's proxy closes it (uvicorn's own
    # default; Serve's is 90): held-open sockets go back soon. A connection that never finishes its headers is not
    # bounded by the proxy (docs/serving.md).
    idle_timeout_s: int = 5


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
           code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status)


def _deadline_error(limits: ServeLimits) -> dict[str, Any]:
    return {"message": f"the request passed this server's deadline of {limits.request_timeout_s:g} s; its generation "
                       "was stopped", "type": "timeout", "param": None, "code": "timeout"}


def _renders_tools(gen: Generator) -> bool:
    """Whether the model's chat template puts a request's tools in the prompt (a template without a tool-calling
    format refuses them or leaves them out)."""
    turns, tool = [{"role": "user", "content": "?"}], {"type": "function", "function": {"name": "probe_tool"}}
    try:
        return "probe_tool" in gen.render(turns, [tool])
    except (TemplateError, jinja2.TemplateError, TypeError, ValueError):
        return False


class _Answers:
    """The answers of one request, made one after another (n of them) in worker threads so the replica's event loop
    keeps serving; cancel() stops whichever is still generating (a deadline, a client gone)."""

    def __init__(self, model: "ChatModel", req: ChatRequest, deadline: float):
        self.model, self.req, self.deadline, self.live = model, req, deadline, []
        self.cancelled = False

    def _start(self) -> StreamedAnswer | ContinuousAnswer:
        gen, limits, req, engine = self.model.generator, self.model.limits, self.req, self.model.engine
        # generate samples from the process's one generator, and has no processor for OpenAI's penalties or bias
        unsupported = engine.unsupported(req.params) if engine is not None else \
            ("seed" if req.params.seed is not None else req.params.generate_cannot())
        if unsupported is not None:
            raise RequestError(unsupported, f"this server cannot honour {unsupported} ({self.model.path}); "
                                            "`serve --engine slots` can")
        vocab = self.model.vocab
        if past := [t for t, _ in req.params.logit_bias if t >= vocab]:
            raise RequestError("logit_bias", f"token {past[0]} is not among the model's {vocab} token ids")
        if req.params.seed is not None and self.live:  # each of the n choices its own draw, as OpenAI's n does
            params = dataclasses.replace(req.params, seed=req.params.seed + len(self.live))
            req = dataclasses.replace(req, params=params)
        limit = limits.prompt_limit(req.params.max_new_tokens, self.model.context)
        if engine is not None and engine.request_room is not None:  # a slot's columns hold prompt and answer
            limit = max(0, min(limit, engine.request_room - req.params.max_new_tokens))
        try:
            if req.tools and not self.model.renders_tools:
                raise RequestError("tools", f"the chat template of {self.model.path} has no tool-calling format")
            answer = ContinuousAnswer(engine, req.turns, req.tools, req.params, self.deadline, limit) if engine \
                else StreamedAnswer(gen, req.turns, req.tools, req.params, self.deadline, limit)
        except (TemplateError, jinja2.TemplateError) as e:  # the role order a template refuses (OpenAI accepts any)
            raise RequestError("messages", f"the model's chat template refuses these messages: {e}") from None
        except PromptTooLong as e:
            room = f"the model reads {self.model.context} tokens" if self.model.context else "the server's limit"
            count = f"{'over ' if e.at_least else ''}{e.tokens}"
            raise RequestError("messages", f"the prompt is {count} tokens; with max_tokens "
                               f"{req.params.max_new_tokens} at most {e.limit} fit ({room})") from None
        self.live.append(answer)
        if self.cancelled:  # the request was cancelled while this answer was being set up
            answer.cancel()
        return answer

    async def next(self) -> StreamedAnswer | ContinuousAnswer:
        return await asyncio.to_thread(self._start)

    def cancel(self) -> None:
        self.cancelled = True
        for answer in list(self.live):
            answer.cancel()


async def _events(answers: _Answers, first: StreamedAnswer, head: dict[str, Any]):
    def chunk(index: int, delta: dict[str, str], finish: str | None = None, more: dict | None = None) -> str:
        body = {**head, "object": "chat.completion.chunk",
                "choices": [{"index": index, "delta": delta, **(more or {}), "finish_reason": finish}]}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    completion, tok = 0, answers.model.generator.tok
    for i in range(answers.req.n):
        answer = first if i == 0 else await answers.next()
        yield chunk(i, {"role": "assistant"})
        stop, cursor = StopText(answers.req.stop), LogprobCursor(tok, answers.req.params.logprobs is not None)
        calls = CallHoldback() if answers.req.tools else None  # text until a call may start, then the calls
        async for text in _until_stop(answer, stop):
            if calls is not None and not (text := calls.feed(text)):
                continue
            yield chunk(i, {"content": text}, more=cursor.next(answer))
        rest, made = calls.finish() if calls is not None else ("", [])
        if rest:
            yield chunk(i, {"content": rest}, more=cursor.next(answer))
        for k, call in enumerate(made):  # each call whole in one delta (OpenAI's clients join the deltas)
            yield chunk(i, {"tool_calls": [{"index": k, **call}]}, more=cursor.next(answer))
        if made:
            yield chunk(i, {}, "tool_calls")
            completion += answer.new_tokens
            continue
        if answer.stopped and not stop.hit:  # the deadline: said in the stream (OpenAI's clients raise on an error)
            yield f"data: {json.dumps({'error': _deadline_error(answers.model.limits)})}\n\n"
            break
        yield chunk(i, {}, "stop" if answer.finished or stop.hit else "length")
        completion += answer.new_tokens
    else:
        if answers.req.include_usage:  # OpenAI's stream_options.include_usage: a last chunk with no choices
            body = {**head, "object": "chat.completion.chunk", "choices": [], "usage": {
                "prompt_tokens": first.prompt_tokens, "completion_tokens": completion,
                "total_tokens": first.prompt_tokens + completion}}
            yield f"data: {json.dumps(body)}\n\n"
    yield "data: [DONE]\n\n"


class _CancellingStream(StreamingResponse):
    """A streamed answer whose generation stops when the response ends for any reason: the client disconnected (Serve
    cancels the request's task), the deadline passed, or it finished."""

    def __init__(self, content: Any, answers: _Answers):
        super().__init__(content, media_type="text/event-stream")
        self.answers = answers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.answers.cancel()


async def _until_stop(answer: Any, stop: StopText):
    """An answer's text as it streams, ended before the first stop string (its generation cancelled there)."""
    async for piece in answer.pieces():
        if text := stop.feed(piece):
            yield text
        if stop.hit:  # the rest is not wanted
            answer.cancel()
            break
    if tail := stop.flush():
        yield tail


async def _whole(answers: _Answers, first: StreamedAnswer, head: dict[str, Any]) -> JSONResponse:
    choices, prompt, new = [], first.prompt_tokens, 0
    try:
        for i in range(answers.req.n):
            answer = first if i == 0 else await answers.next()
            stop = StopText(answers.req.stop)
            text = "".join([piece async for piece in _until_stop(answer, stop)])
            if answer.stopped and not stop.hit:
                return JSONResponse({"error": _deadline_error(answers.model.limits)}, status_code=504)
            new += answer.new_tokens
            content, calls = split_calls(text) if answers.req.tools else (text, [])
            message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
            finish = "tool_calls" if calls else "stop" if answer.finished or stop.hit else "length"
            choices.append({"index": i, "message": message, "finish_reason": finish})
            if answers.req.params.logprobs is not None:  # the tokens the answer holds (a stop string's cut them)
                choices[-1]["logprobs"] = {"content": logprob_content(answers.model.generator.tok, answer.logprobs,
                                                                      0, answer.new_tokens)}
    finally:  # a cancelled request (client gone, Serve's own timeout) stops its generation too
        answers.cancel()
    usage = {"prompt_tokens": prompt, "completion_tokens": new, "total_tokens": prompt + new}
    return JSONResponse({**head, "object": "chat.completion", "usage": usage, "choices": choices})


@serve.deployment
@serve.ingress(app)
class ChatModel:
    def __init__(self, model_path: str, template: str | None, name: str, api_key: str | None, limits: ServeLimits,
                 engine: str = "auto"):
        use_compile_caches()  # the slot engine's compiled decode step: a restarted replica loads it
        self.generator = Generator(model_path, template, GenerationParams().as_dict())
        self.name, self.api_key = name, api_key
        self.context = context_length(self.generator.model)
        self.vocab = self.generator.model.get_output_embeddings().weight.shape[0]  # the logits logit_bias may bias
        self.renders_tools = _renders_tools(self.generator)
        self.limits = limits.for_context(self.context)
        self.engine, self.path = serving_path(self.generator, self.limits, self.context, engine)

    def _refused(self, request: Request) -> JSONResponse | None:
        if self.api_key is None:
            return None
        given = request.headers.get("authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            return None
        return _error(401, "a valid API key is required (Authorization: Bearer <key>)", "authentication_error")

    @app.get("/v1/models")
    async def models(self, request: Request) -> JSONResponse:
        refused = self._refused(request)
        return refused or JSONResponse({"object": "list", "data": [
            {"id": self.name, "object": "model", "created": 0, "owned_by": "medgpt-ray"}]})

    @app.post("/v1/chat/completions")
    async def chat(self, request: Request):
        if (refused := self._refused(request)) is not None:
            return refused
        try:
            req = parse_chat(await read_body(request, self.limits.max_body_bytes), self.limits)
            if req.model is not None and req.model != self.name:  # OpenAI's answer for a model it does not have
                return _error(404, f"the model {req.model[:80]!r} does not exist here; this server serves "
                                   f"{self.name!r} (GET /v1/models)", param="model", code="model_not_found")
            answers = _Answers(self, req, time.monotonic() + self.limits.request_timeout_s)
            first = await answers.next()
        except RequestError as e:
            return _error(e.status, str(e), param=e.field)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": self.name,
                "system_fingerprint": f"medgpt-ray; {self.path}"}
        if req.stream:
            return _CancellingStream(_events(answers, first, head), answers)
        return await _whole(answers, first, head)


def serve_model(source: ModelSource, opts: ServeOptions) -> str:
    """Start (or update) the app on the connected Ray cluster; returns its base URL."""
    name = opts.name or source.stage or source.path.name
    if not opts.verbose:  # Serve's driver-side INFO lines ("Started Serve", "Application ... is ready")
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    # Serve's own end-to-end timeout a little past ours: a backstop that answers (and cancels) a request stuck
    # anywhere; our deadline, checked between tokens, is what stops a generation.
    serve.start(http_options={"host": opts.host, "port": opts.port,
                              "request_timeout_s": opts.limits.request_timeout_s + 10,
                              "keep_alive_timeout_s": opts.idle_timeout_s})
    deployment = ChatModel.options(num_replicas=opts.replicas, max_ongoing_requests=opts.limits.max_concurrent,
                                   ray_actor_options={
        "num_gpus": opts.gpus_per_replica, "num_cpus": opts.cpus_per_replica})
    serve.run(deployment.bind(str(source.path), source.template, name, opts.api_key, opts.limits, opts.engine),
              name="medgpt-ray", route_prefix="/")
    return f"http://{opts.host}:{opts.port}"


def default_gpus_per_replica() -> float:
    """1 where the connected cluster has a GPU, else 0 (CPU replicas)."""
    return 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0


def stop_serving() -> None:
    serve.shutdown()
