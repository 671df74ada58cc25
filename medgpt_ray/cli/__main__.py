"""`python -m medgpt_ray.cli ...`: the same as the `medgpt-ray` command."""

import sys

from medgpt_ray.cli import main

sys.exit(main())
