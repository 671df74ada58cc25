"""`medgpt-ray` command line: run (the pipeline), clean, estimate and plan (GPU memory), topo (placement), tune,
generate, chat, serve, export, report (a run's HTML report).

Front-ends only: each command parses, calls one library function and prints.
"""

from __future__ import annotations

import sys

from medgpt_ray.cli import chat, clean, export, generate, memory, report, run, serve, topo, tune
from medgpt_ray.cli.args import OneLineParser


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="medgpt-ray", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {
        "run": (run.add_run_args, run.run_pipeline, run.RUN_HELP),
        "clean": (clean.add_clean_args, clean.run_clean, "clean a raw corpus with Ray Data"),
        "estimate": (memory.add_estimate_args, memory.run_estimate, "predict one training setup's peak GPU memory"),
        "plan": (memory.add_plan_args, memory.run_plan, "plan every stage of a config to fit the GPU memory"),
        "topo": (topo.add_topo_args, topo.run_topo, "GPU topology, the GPUs a job should use, and NCCL settings"),
        "tune": (tune.add_tune_args, tune.run_tune, "a Ray Tune sweep over one stage, planned before any trial runs"),
        "generate": (generate.add_generate_args, generate.run_generate,
                     "answer a file of prompts with a trained model (Ray Data actor pool)"),
        "chat": (chat.add_chat_args, chat.run_chat, "talk to a trained model in the terminal (streamed answers)"),
        "serve": (serve.add_serve_args, serve.run_serve, "an OpenAI-compatible chat endpoint on Ray Serve"),
        "export": (export.add_export_args, export.run_export,
                   "a finished stage of a run as a model directory with its model card"),
        "report": (report.add_report_args, report.run_report, "a run's self-contained HTML report, with plots"),
    }
    for name, (add_args, _, help_) in commands.items():
        add_args(sub.add_parser(name, help=help_))
    args = parser.parse_args(argv)
    try:
        return commands[args.command][1](args)
    except KeyboardInterrupt:  # a command that does not say more about what a Ctrl-C left (run and clean do)
        print(f"interrupted: medgpt-ray {args.command} stopped", file=sys.stderr)
        return 130
