#!/usr/bin/env bash
# bitsandbytes for the GPU machine, cut to the image's CUDA (issue 49 item 3): its 43 MB wheel carries a library for
# every CUDA, ROCm and XPU release (129 MB unpacked); a run loads only the one matching torch.version.cuda (13.0 on
# the image: libbitsandbytes_cuda130.so, 3.9 MB) and the CPU one. Cut, it is ~2 MB, so it travels beside
# ../shared/gpu/make-wheelhouse.sh's .whl (ray, trl, deepspeed: ~51 MB) inside a run's 64 MiB, as Ray's jars are
# stripped there.
#
#   bash bench/make_bnb_wheel.sh [DEST] [CUDA]     # default .whl and 130 (CUDA 13.0); from the project root
#   # then carry [".whl"]: the run's pip install of .whl/*.whl installs it with the rest
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.whl}
CUDA=${2:-130}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$DEST"
case "$DEST" in /*) ;; *) grep -qx "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >> .git/info/exclude;; esac
rm -f "$DEST"/bitsandbytes-*.whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_24_x86_64 -d "$DEST" bitsandbytes==0.50.2
WHEEL=$(ls "$DEST"/bitsandbytes-*.whl)
KEEP="bitsandbytes/libbitsandbytes_cuda$CUDA.so"
unzip -l "$WHEEL" | grep " $KEEP$" >/dev/null || { echo "$WHEEL has no $KEEP"; exit 1; }
CUT=$(unzip -Z1 "$WHEEL" | grep -E '^bitsandbytes/libbitsandbytes_(cuda|rocm|xpu)[0-9]*\.so$' | grep -vx "$KEEP")
# shellcheck disable=SC2086  # one name per line, none with spaces
zip -q -d "$WHEEL" $CUT
echo "$WHEEL: kept $KEEP and the CPU library; $(du -h "$WHEEL" | cut -f1)"
