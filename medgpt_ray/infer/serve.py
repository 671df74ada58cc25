"""An OpenAI-compatible endpoint on Ray Serve: GET /v1/models and POST /v1/chat/completions (streamed as server-sent
events, or whole), one model per replica (a GPU each where asked), the chat template the model was trained with.
Bound to loopback unless told otherwise; with an API key every request needs `Authorization: Bearer <key>`.
(No `from __future__ import annotations`: FastAPI reads the handlers' annotations as types.)"""


import hmac
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve

from medgpt_ray.generation.engine import Generator
from medgpt_ray.generation.params import GenerationParams
from medgpt_ray.generation.stream import StreamedAnswer
from medgpt_ray.infer.source import ModelSource

ROLES = ("system", "user", "assistant")
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
    max_new_tokens: int = 512  # when a request names no max_tokens
    verbose: bool = False


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def _messages(body: dict[str, Any]) -> list[dict] | str:
    """The request's messages as turns, or why they cannot be answered."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: a non-empty list is required"
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            return f"messages[{i}]: role one of {', '.join(ROLES)} and a string content are required"
        turns.append({"role": m["role"], "content": m["content"]})
    if turns[-1]["role"] != "user":
        return "messages: the last message must be the user's"
    return turns


def _params(body: dict[str, Any], default_max: int) -> GenerationParams | str:
    try:
        return GenerationParams(max_new_tokens=int(body.get("max_tokens") or default_max),
                                temperature=float(body.get("temperature", 0.0)), top_p=float(body.get("top_p", 1.0)))
    except (TypeError, ValueError) as e:
        return f"max_tokens, temperature, top_p: {e}"


def _events(answer: StreamedAnswer, head: dict[str, Any]):
    def chunk(delta: dict[str, str], finish: str | None = None) -> str:
        body = {**head, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    yield chunk({"role": "assistant"})
    for piece in answer:
        if piece:
            yield chunk({"content": piece})
    yield chunk({}, "stop" if answer.finished else "length")
    yield "data: [DONE]\n\n"


@serve.deployment
@serve.ingress(app)
class ChatModel:
    def __init__(self, model_path: str, template: str | None, name: str, api_key: str | None, max_new_tokens: int):
        self.generator = Generator(model_path, template, GenerationParams().as_dict())
        self.name, self.api_key, self.max_new_tokens = name, api_key, max_new_tokens

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
            body = await request.json()
        except json.JSONDecodeError:
            return _error(400, "the body is not JSON")
        turns, params = _messages(body), _params(body, self.max_new_tokens)
        if isinstance(turns, str) or isinstance(params, str):
            return _error(400, turns if isinstance(turns, str) else params)
        answer = StreamedAnswer(self.generator, turns, None, params)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": self.name}
        if body.get("stream"):
            return StreamingResponse(_events(answer, head), media_type="text/event-stream")
        text = "".join(answer)
        usage = {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.new_tokens,
                 "total_tokens": answer.prompt_tokens + answer.new_tokens}
        return JSONResponse({**head, "object": "chat.completion", "usage": usage, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text},
             "finish_reason": "stop" if answer.finished else "length"}]})


def serve_model(source: ModelSource, opts: ServeOptions) -> str:
    """Start (or update) the app on the connected Ray cluster; returns its base URL."""
    name = opts.name or source.stage or source.path.name
    if not opts.verbose:  # Serve's driver-side INFO lines ("Started Serve", "Application ... is ready")
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    serve.start(http_options={"host": opts.host, "port": opts.port})
    deployment = ChatModel.options(num_replicas=opts.replicas, ray_actor_options={
        "num_gpus": opts.gpus_per_replica, "num_cpus": opts.cpus_per_replica})
    serve.run(deployment.bind(str(source.path), source.template, name, opts.api_key, opts.max_new_tokens),
              name="medgpt-ray", route_prefix="/")
    return f"http://{opts.host}:{opts.port}"


def default_gpus_per_replica() -> float:
    """1 where the connected cluster has a GPU, else 0 (CPU replicas)."""
    return 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0


def stop_serving() -> None:
    serve.shutdown()
