"""`medgpt-ray serve`: an OpenAI-compatible chat endpoint for a trained model on Ray Serve."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import time
from pathlib import Path

from medgpt_ray.cli.args import add_model_args, non_negative_float, positive_float, positive_int

API_KEY_ENV = "MEDGPT_RAY_API_KEY"


def add_serve_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--port", type=positive_int, default=8000)
    p.add_argument("--replicas", type=positive_int, default=1, help="model replicas, one model each")
    p.add_argument("--gpus-per-replica", type=non_negative_float, default=None,
                   help="default: 1 where the cluster has GPUs, else 0 (CPU)")
    p.add_argument("--api-key", default=None,
                   help=f"require `Authorization: Bearer KEY` (default: ${API_KEY_ENV} when set, else no key)")
    p.add_argument("--no-api-key", "--allow-no-key", dest="no_api_key", action="store_true",
                   help="serve a --host other than loopback without an API key: anyone who reaches the port is "
                        "answered (refused otherwise)")
    p.add_argument("--name", default=None, help="the model's id in /v1/models (default: the stage's name)")
    p.add_argument("--engine", choices=("auto", "transformers", "slots"), default="auto",
                   help="how concurrent requests share the GPU: slots of a static cache decoded by one compiled step "
                        "(CUDA graphs), or transformers' continuous batching; auto: slots unless the model has "
                        "sliding-window layers")
    add_limit_args(p)
    p.add_argument("--num-cpus", type=positive_int, default=None, help="CPUs for a local Ray cluster (default: all)")
    p.add_argument("--log-file", default=None,
                   help="where Ray's and Serve's own lines go (default: serve-PORT.log in the cache directory, "
                        "$MEDGPT_RAY_CACHE or ~/.cache/medgpt-ray)")
    p.add_argument("--verbose", action="store_true", help="Ray's and Serve's own lines here instead")


def add_limit_args(p: argparse.ArgumentParser) -> None:
    """What one request may ask (infer/limits.py ServeLimits has the defaults); past them: 400, 413 or 504."""
    from medgpt_ray.infer.limits import ServeLimits

    p.add_argument("--max-new-tokens", type=positive_int, default=512,
                   help="a request's max_tokens when it names none (default 512)")
    p.add_argument("--max-tokens-limit", type=positive_int, default=2048,
                   help="the most max_tokens a request may ask (default 2048, and below the model's context)")
    p.add_argument("--max-prompt-tokens", type=positive_int, default=None,
                   help="the most prompt tokens (default: the model's context minus the request's max_tokens)")
    p.add_argument("--max-body-bytes", type=positive_int, default=1 << 20,
                   help="a larger request body is refused (413) unread (default 1048576: 1 MiB)")
    p.add_argument("--max-n", type=positive_int, default=4, help="the most choices (n) per request (default 4)")
    p.add_argument("--max-concurrent", type=positive_int, default=32,
                   help="requests a replica answers at once, batched continuously; more wait (default 32)")
    p.add_argument("--stream-interval", type=positive_int, default=ServeLimits.stream_interval,
                   help=f"new tokens a streamed piece waits for after the first, which goes at once (default "
                        f"{ServeLimits.stream_interval}; 1: a piece a token, as vLLM's option of this name; each "
                        "piece costs the replica and Serve's proxy about the same, whatever its length)")
    p.add_argument("--request-timeout", type=positive_float, default=120.0,
                   help="seconds a request may take; past them its generation stops (504) (default 120)")
    p.add_argument("--idle-timeout", type=positive_int, default=5,
                   help="seconds a kept-alive connection may sit idle after an answer before it is closed (default 5)")


def _limits(args: argparse.Namespace):
    from medgpt_ray.infer.limits import ServeLimits

    return ServeLimits(max_body_bytes=args.max_body_bytes, max_prompt_tokens=args.max_prompt_tokens,
                       max_tokens_limit=args.max_tokens_limit, default_max_tokens=args.max_new_tokens,
                       max_n=args.max_n, max_concurrent=args.max_concurrent, request_timeout_s=args.request_timeout,
                       stream_interval=args.stream_interval)


def serve_log_file(args: argparse.Namespace) -> Path:
    """--log-file, else serve-PORT.log in the cache directory: never the current directory, where a checkout would
    collect log files (issue 36)."""
    from medgpt_ray.tiny import cache_root

    return Path(args.log_file) if args.log_file else cache_root() / f"serve-{args.port}.log"


def open_to_all(host: str, key: str | None, accepted: bool) -> None:
    """ValueError for a --host other than loopback without an API key, unless --no-api-key accepts it: a medical
    model answering anyone who can reach the machine is never the default."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        loopback = False
    if not (loopback or key or accepted):
        raise ValueError(f"--host {host} without an API key would answer anyone who reaches the server's port: "
                         f"set --api-key or ${API_KEY_ENV}, or pass --no-api-key to serve openly")


def run_serve(args: argparse.Namespace) -> int:
    from medgpt_ray.infer.source import ModelSourceError, resolve_model

    try:
        source = resolve_model(args.model, args.template)
        limits = _limits(args)
        key = args.api_key or os.environ.get(API_KEY_ENV) or None
        open_to_all(args.host, key, args.no_api_key)
    except (ModelSourceError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from medgpt_ray.infer.serve import ServeOptions, default_gpus_per_replica, serve_model, stop_serving
    from medgpt_ray.infer.serve_engine import engine_line
    from medgpt_ray.run.ray_env import connect_ray, echo
    log_file = serve_log_file(args)
    connect_ray(args.num_cpus, log_file=log_file, verbose=args.verbose, worker_logs=args.verbose)
    gpus = args.gpus_per_replica if args.gpus_per_replica is not None else default_gpus_per_replica()
    opts = ServeOptions(args.host, args.port, args.replicas, gpus, api_key=key, name=args.name,
                        limits=limits, verbose=args.verbose, engine=args.engine,
                        idle_timeout_s=args.idle_timeout)
    url = serve_model(source, opts)
    echo(f"[serve] {source.path} at {url}/v1 ({args.replicas} replica(s), {gpus:g} GPU each; "
         f"{'API key required' if key else 'no API key'}); Ray's own lines: {log_file.resolve()}; "
         "Ctrl-C stops")
    echo(f"[serve] {engine_line(str(source.path), args.engine)}")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        echo("[serve] stopping")
        try:
            stop_serving()
        except KeyboardInterrupt:  # a second Ctrl-C: leave now, the local cluster goes with this process
            pass
    return 0
