"""`medgpt-ray serve` on the shared local Ray cluster with the tiny model: the OpenAI-compatible endpoints answer
(whole and streamed, the same greedy text), the API key is enforced, bad requests get 400 with the reason."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from medgpt_ray.infer.limits import ServeLimits
from medgpt_ray.infer.serve import ServeOptions, serve_model
from medgpt_ray.infer.source import ModelSource
from tests.ray_startup import free_port

pytestmark = pytest.mark.ray
KEY = "test-key-123"


@pytest.fixture(scope="module")
def endpoint(ray_cluster, tiny_model):
    from ray import serve

    url = serve_model(ModelSource(tiny_model, "chatml", "sft"),
                      ServeOptions(port=free_port(), api_key=KEY, cpus_per_replica=0.5,
                                   limits=ServeLimits(default_max_tokens=8)))
    yield url
    serve.shutdown()


def call(url: str, path: str, body: dict | None = None, key: str | None = KEY) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body is not None else None,
                                 headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_models_and_the_api_key(endpoint):
    status, body = call(endpoint, "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["sft"]
    assert call(endpoint, "/v1/models", key=None)[0] == 401
    assert call(endpoint, "/v1/models", key="wrong")[0] == 401
    chat = {"messages": [{"role": "user", "content": "头痛怎么办？"}]}
    assert call(endpoint, "/v1/chat/completions", chat, key=None)[0] == 401


def test_whole_and_streamed_answers_agree(endpoint):
    chat = {"model": "sft", "messages": [{"role": "system", "content": "你是医生"},
                                         {"role": "user", "content": "头痛怎么办？"}], "max_tokens": 6}
    status, body = call(endpoint, "/v1/chat/completions", chat)
    whole = json.loads(body)
    assert status == 200 and whole["object"] == "chat.completion"
    choice = whole["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
    usage = whole["usage"]
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    status, body = call(endpoint, "/v1/chat/completions", {**chat, "stream": True})
    events = [line.removeprefix("data: ") for line in body.decode().split("\n\n") if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == choice["message"]["content"]  # greedy: the same answer, streamed
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]


@pytest.mark.parametrize("body, reason", [
    ({"messages": []}, "non-empty list"),
    ({"messages": [{"role": "doctor", "content": "x"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}, "must be the user"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
])
def test_bad_requests_say_why(endpoint, body, reason):
    status, raw = call(endpoint, "/v1/chat/completions", body)
    assert status == 400 and reason in json.loads(raw)["error"]["message"]
