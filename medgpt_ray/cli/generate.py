"""`medgpt-ray generate`: answer a file of prompts with a trained model, on a Ray Data actor pool."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from medgpt_ray.cli.args import add_model_args, fraction, non_negative_float, non_negative_int, positive_int


def add_generate_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--input", dest="inputs", nargs="+", required=True, metavar="FILE",
                   help="prompts: .jsonl .json .csv .parquet .txt (GRPO question, ShareGPT or role/content turns "
                        "ending on the user, SFT conversations up to their last user turn, text; no reference answer "
                        "needed)")
    p.add_argument("--out", required=True, help="output directory: generations/*.parquet, summary.json; a re-run "
                                                "with the same settings generates only what is missing")
    p.add_argument("--max-new-tokens", type=positive_int, default=256)
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 (default) decodes greedily")
    p.add_argument("--top-p", type=fraction, default=1.0)
    p.add_argument("--top-k", type=non_negative_int, default=0, help="0 (default): no top-k")
    p.add_argument("--repetition-penalty", type=non_negative_float, default=1.0,
                   help="transformers' repetition penalty: 1 (default) none, above 1 fewer repeats")
    p.add_argument("--num-samples", type=positive_int, default=1, help="answers per prompt")
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--batch-size", type=positive_int, default=16, help="prompts per generate call")
    p.add_argument("--num-workers", type=positive_int, default=1, help="actors, one model each")
    p.add_argument("--gpus-per-worker", type=non_negative_float, default=None,
                   help="default: 1 where the cluster has GPUs, else 0 (CPU)")
    p.add_argument("--generation-path", choices=("auto", "dynamic", "static"), default="auto",
                   help="decode path: static (one static KV cache, the decode step compiled with CUDA graphs), "
                        "dynamic (HF generate's growing cache), auto (static on a GPU, dynamic on the "
                        "CPU)")
    p.add_argument("--num-cpus", type=positive_int, default=None, help="CPUs for a local Ray cluster (default: all)")
    p.add_argument("--verbose", action="store_true", help="Ray's own log lines here (default: OUT/generate.log)")


def run_generate(args: argparse.Namespace) -> int:
    from medgpt_ray.generation.params import GenerationParams
    from medgpt_ray.infer.batch import GenerateOptions, generate
    from medgpt_ray.infer.source import ModelSourceError, resolve_model
    from medgpt_ray.run.ray_env import connect_ray, echo

    try:
        params = GenerationParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                  top_p=args.top_p, num_samples=args.num_samples, seed=args.seed,
                                  top_k=args.top_k, repetition_penalty=args.repetition_penalty)
        resolve_model(args.model, args.template)  # before Ray starts: a wrong --model is one line
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    connect_ray(args.num_cpus, log_file=out / "generate.log", verbose=args.verbose, worker_logs=args.verbose)
    opts = GenerateOptions(args.model, args.inputs, out, params, args.template, args.batch_size, args.num_workers,
                           args.gpus_per_worker, args.generation_path)
    try:
        generate(opts, echo)
    except (ModelSourceError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
