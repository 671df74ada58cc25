#!/usr/bin/env bash
# A baseline for a GPU call: the package as it was at REV (default edb0376, the commit before issue 49's chunked
# losses) in the ignored .base/, with today's bench scripts in .base/benchnow/ so both sides are measured by one
# harness. A script run from .base/benchnow/ puts .base/ first on sys.path, so it imports the old medgpt_ray.
# ~3.8 MB: it travels beside .whl (carry both; with .whl-bnb too the three are ~0.3 MB under a run's 64 MiB). Usage, from the project root: bash bench/make_baseline_tree.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-edb0376}
rm -rf .base && mkdir .base
git archive "$rev" medgpt_ray jobs configs data pyproject.toml | tar -x -C .base  # its bench/ is not run
mkdir .base/benchnow .base/bench && cp bench/*.py .base/benchnow/
cp bench/family_models.py .base/bench/  # memory_calibration imports it as bench.family_models, from .base's root
git rev-parse "$rev" >.base/REV
grep -qx '/.base/' .git/info/exclude 2>/dev/null || grep -qx '/.base/' .gitignore || echo '/.base/' >>.gitignore
echo ".base/: medgpt_ray at $(cat .base/REV), bench scripts of $(git rev-parse --short HEAD) in .base/benchnow/"
