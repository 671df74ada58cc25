#!/usr/bin/env bash
# A baseline for a GPU call: the package as it was at REV (default edb0376, the commit before issue 49's chunked
# losses) in the ignored .base/, with today's bench scripts in .base/benchnow/ so both sides are measured by one
# harness. A script run from .base/benchnow/ puts .base/ first on sys.path, so it imports the old medgpt_ray.
# ~1.8 MiB: it travels beside .whl and .whl-bnb (call 12's baseline plans simpo in QLoRA) inside a run's 64 MiB.
# Usage, from the project root: bash bench/make_baseline_tree.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-edb0376}
rm -rf .base && mkdir .base
# Of data/, a run there reads only data/sample/*.jsonl (the tiny tokenizer's corpus; memory_calibration's
# pretrain.jsonl). Where REV's equal HEAD's they stay out (2.2 MiB; .whl, .whl-bnb and this travel together) and
# gpu_calls.sh copies the tree's own into .base/ on the device machine; where they differ, REV's travel.
git archive "$rev" medgpt_ray jobs configs pyproject.toml | tar -x -C .base
if ! git diff --quiet "$rev" HEAD -- ':(glob)data/sample/*.jsonl'; then
  git archive "$rev" ':(glob)data/sample/*.jsonl' | tar -x -C .base
fi
mkdir .base/benchnow .base/bench && cp bench/*.py .base/benchnow/
cp bench/family_models.py .base/bench/  # memory_calibration imports it as bench.family_models, from .base's root
git rev-parse "$rev" >.base/REV
grep -qx '/.base/' .git/info/exclude 2>/dev/null || grep -qx '/.base/' .gitignore || echo '/.base/' >>.gitignore
echo ".base/: medgpt_ray at $(cat .base/REV), bench scripts of $(git rev-parse --short HEAD) in .base/benchnow/"
