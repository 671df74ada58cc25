"""Entry point for `ray job submit -- python jobs/pipeline.py --config ...` and for `python jobs/pipeline.py`.

Under `ray job submit` RAY_ADDRESS is set and the job joins that cluster; run
directly, it starts a local Ray cluster on this machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# A `ray job submit --working-dir .` copy is not pip-installed: make the package importable from it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from medgpt_ray.cli.run import RUN_HELP, add_run_args, run_pipeline  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=f"medgpt-ray on Ray: {RUN_HELP}")
    add_run_args(parser)
    return run_pipeline(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
