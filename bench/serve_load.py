"""Load test of `serve` (issue 35 item 4): N concurrent streaming clients (the `openai` Python client), each asking
for --max-tokens new tokens to its own prompt from data/sample's SFT questions (random-init weights run every answer
to its limit); reports aggregate completion tokens/s, time to first token (p50/p90/p99), each client's tokens/s, and
the serving path the replica chose (continuous batching, or one request at a time where the model cannot batch).

Starts a local Ray cluster and the app on --model (a model directory or run stage, as `medgpt-ray serve` takes it),
or drives a running server with --url. On the GPU machine (24 GiB cap is the serve replica's own business):

    python bench/serve_load.py --model /tmp/models/qwen2.5-1.5b --clients 32 --max-tokens 256 --out $OUT/serve.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def sample_questions(n: int) -> list[str]:
    """n user questions from the shipped ShareGPT sample, repeated in order where it has fewer."""
    rows = [json.loads(line) for line in (REPO / "data/sample/sft_sharegpt.jsonl").read_text().splitlines() if line]
    questions = [t["value"] for r in rows for t in r["conversations"][:1] if t.get("from") == "human"]
    return [questions[i % len(questions)] for i in range(n)]


async def one_client(client: Any, model: str, question: str, max_tokens: int, read_delay_s: float = 0.0) -> dict:
    """One streamed answer: seconds to its first content piece, pieces and completion tokens (the usage the server
    reports in its last chunk), seconds in all. `read_delay_s` between pieces makes a slow reader."""
    t0 = time.perf_counter()
    first, pieces, tokens, fingerprint = None, 0, None, None
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], max_tokens=max_tokens, temperature=1.0,
        stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        fingerprint = fingerprint or chunk.system_fingerprint
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else time.perf_counter() - t0
            pieces += 1
            if read_delay_s:
                await asyncio.sleep(read_delay_s)
    return {"ttft_s": first, "pieces": pieces, "completion_tokens": tokens if tokens is not None else pieces,
            "seconds": time.perf_counter() - t0, "serving_path": fingerprint}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def drive(url: str, model: str, clients: int, max_tokens: int, api_key: str = "none") -> dict:
    """`clients` concurrent streaming requests against `url` (the server's base, without /v1); the summary."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=600)
    questions = sample_questions(clients)
    t0 = time.perf_counter()
    results = await asyncio.gather(*[one_client(client, model, q, max_tokens) for q in questions],
                                   return_exceptions=True)
    wall = time.perf_counter() - t0
    await client.close()
    ok = [r for r in results if isinstance(r, dict)]
    errors = [f"{type(r).__name__}: {r}"[:200] for r in results if not isinstance(r, dict)]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    tokens = sum(r["completion_tokens"] for r in ok)
    return {"clients": clients, "max_tokens": max_tokens, "ok": len(ok), "errors": errors, "wall_s": round(wall, 3),
            "completion_tokens": tokens, "tokens_per_s": round(tokens / wall, 1) if wall else None,
            "ttft_p50_s": percentile(ttft, 0.5), "ttft_p90_s": percentile(ttft, 0.9),
            "ttft_p99_s": percentile(ttft, 0.99),
            "client_tokens_per_s_median": statistics.median(r["completion_tokens"] / r["seconds"] for r in ok)
            if ok else None, "pieces_per_answer_median": statistics.median(r["pieces"] for r in ok) if ok else None,
            "serving_path": ok[0]["serving_path"] if ok else None}


def start_local(model: str, port: int, gpus: float | None, engine: str = "auto",
                limits: dict[str, int] | None = None) -> tuple[str, str]:
    """A local Ray cluster and the app on it (`engine`, ServeLimits' `limits`); (base URL, the model's id)."""
    import ray

    from medgpt_ray.infer.limits import ServeLimits
    from medgpt_ray.infer.serve import ServeOptions, default_gpus_per_replica, serve_model
    from medgpt_ray.infer.source import resolve_model

    ray.init(address="local", include_dashboard=False, log_to_driver=False)  # its own cluster, never a running one
    source = resolve_model(model, None)
    opts = ServeOptions(port=port, gpus_per_replica=default_gpus_per_replica() if gpus is None else gpus,
                        engine=engine, limits=ServeLimits(**(limits or {})))
    return serve_model(source, opts), source.stage or source.path.name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a model directory or run stage to serve locally")
    ap.add_argument("--url", help="drive a running server instead (its base URL, e.g. http://127.0.0.1:8000)")
    ap.add_argument("--name", default=None, help="the model's id with --url (default: the first of /v1/models)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="the first round warms up; the last is reported")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--gpus-per-replica", type=float, default=None)
    ap.add_argument("--engine", choices=("auto", "transformers", "slots"), default="auto", help="serve's --engine")
    ap.add_argument("--max-prompt-tokens", type=int, default=None, help="serve's --max-prompt-tokens")
    ap.add_argument("--max-tokens-limit", type=int, default=2048, help="serve's --max-tokens-limit")
    ap.add_argument("--stream-interval", type=int, default=1, help="serve's --stream-interval")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not (args.model or args.url):
        ap.error("--model or --url is required")
    limits = {"max_prompt_tokens": args.max_prompt_tokens, "max_tokens_limit": args.max_tokens_limit,
              "default_max_tokens": min(512, args.max_tokens_limit), "max_concurrent": max(32, args.clients),
              "stream_interval": args.stream_interval}
    url, name = (args.url, args.name) if args.url else start_local(args.model, args.port, args.gpus_per_replica,
                                                                   args.engine, limits)
    if name is None:
        import urllib.request

        with urllib.request.urlopen(f"{url}/v1/models") as r:
            name = json.load(r)["data"][0]["id"]
    rounds = [asyncio.run(drive(url, name, args.clients, args.max_tokens)) for _ in range(args.rounds)]
    result = {"command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
              "model": args.model or args.url, "rounds": rounds, **rounds[-1]}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if not rounds[-1]["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
