"""`ray job submit -- python jobs/tune_sweep.py --config C --sweep S [--from-run RUN]`: a Ray Tune sweep over one
stage, with every argument of `medgpt-ray tune` (medgpt_ray/cli/tune.py) forwarded as it is."""

from __future__ import annotations

import sys

from medgpt_ray.cli import main

if __name__ == "__main__":
    sys.exit(main(["tune", *sys.argv[1:]]))
