"""Entry point for `ray job submit -- python jobs/clean_corpus.py INPUT... --out DIR [--kind K] [--config C]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from medgpt_ray.cli.clean import add_clean_args, run_clean  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description="Clean a raw medical corpus with Ray Data")
    add_clean_args(parser)
    return run_clean(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
