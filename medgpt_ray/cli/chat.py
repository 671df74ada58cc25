"""`medgpt-ray chat`: talk to a trained model in the terminal, its answers streamed as they are generated."""

from __future__ import annotations

import argparse
import sys

from medgpt_ray.cli.args import add_model_args, non_negative_float, positive_int

HELP = "/reset starts the conversation over, /exit (or Ctrl-D) ends it"


def add_chat_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--system", default=None, help="system prompt (default: the template's)")
    p.add_argument("--max-new-tokens", type=positive_int, default=512)
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 (default) decodes greedily")
    p.add_argument("--generation-path", choices=("auto", "dynamic", "static"), default="auto",
                   help="decode path: static (one static KV cache for the conversation, the decode step compiled "
                        "with CUDA graphs), dynamic (HF generate's growing cache), auto (static on a GPU, "
                        "dynamic on the CPU)")


def run_chat(args: argparse.Namespace) -> int:
    from medgpt_ray.generation.params import GenerationParams
    from medgpt_ray.infer.chat import ChatSession
    from medgpt_ray.infer.source import ModelSourceError, resolve_model

    try:
        source = resolve_model(args.model, args.template)
    except ModelSourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    session = ChatSession(source, GenerationParams(max_new_tokens=args.max_new_tokens,
                                                   temperature=args.temperature), args.system, args.generation_path)
    print(f"chat with {source.path} (template {source.template or 'the tokenizer own'}; decode path "
          f"{session.generator.path.describe()}); {HELP}", flush=True)
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            print()
            return 0
        if line in ("/exit", "/quit"):
            return 0
        if line == "/reset":
            session.reset()
            print("(conversation cleared)", flush=True)
            continue
        if not line:
            continue
        if line.startswith("/"):
            print(f"unknown command {line.split()[0]}: {HELP}", flush=True)
            continue
        print("bot> ", end="", flush=True)
        session.reply(line, lambda piece: print(piece, end="", flush=True))
        print(flush=True)
