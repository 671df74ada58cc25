"""What every command's parser shares: one-line usage errors (rc 2) and number types that refuse nonsense before
anything runs (a negative GPU budget, a LoRA rank of 0)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (the full usage is one --help away), rc 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(kind: type, test, what: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return value

    parse.__name__ = what  # argparse names the type in its message
    return parse


positive_int = _number(int, lambda v: v > 0, "a positive integer")
non_negative_int = _number(int, lambda v: v >= 0, "an integer >= 0")
positive_float = _number(float, lambda v: v > 0 and v != float("inf"), "a positive number")
non_negative_float = _number(float, lambda v: 0 <= v < float("inf"), "a number >= 0")
fraction = _number(float, lambda v: 0 < v <= 1, "a fraction in (0, 1]")


def config_error(e: Exception) -> int:
    """A config problem as the commands report it: on stderr, prefixed, rc 2 (no traceback)."""
    print(f"config error: {e}", file=sys.stderr)
    return 2


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--model and --template, as generate, chat and serve read them (infer/source.py resolves them)."""
    p.add_argument("--model", required=True, help="RUN_DIR/STAGE (a finished stage) or a model directory")
    p.add_argument("--template", default=None,
                   help="chat template (default: the run's for RUN_DIR/STAGE, else the tokenizer's own)")
