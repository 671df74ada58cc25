"""`ray job submit -- python jobs/tune_sweep.py --config C --sweep S`: a Ray Tune sweep over one stage."""

from __future__ import annotations

import sys

from medgpt_ray.cli import main

if __name__ == "__main__":
    sys.exit(main(["tune", *sys.argv[1:]]))
