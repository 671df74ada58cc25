#!/usr/bin/env bash
# The Ray-free wheelhouse of issue 47's Hopper question, for bench/gpu_hybrid_call.sh (one GPU run carries both):
#   .whl-hybrid/      ../shared/gpu/make-wheelhouse.sh --no-ray (trl, datasets, peft, deepspeed, ...; ~9 MB) and
#                     flash-linear-attention + fla-core 0.6.0 (the `gpu` extra's, pure Python, ~1.5 MB)
#   .tl/tilelang.tar.xz  tilelang 0.1.15 with what it needs that the image lacks (apache-tvm-ffi, torch-c-dlpack-ext,
#                     z3-solver), unpacked and re-packed with xz: as wheels they are ~82 MB (tilelang's libtvm_compiler
#                     and libtilelang alone 35 MB deflated; z3's wheel holds libz3 twice), over a run's 64 MiB. Left out:
#                     TVM's C++ sources, cutlass's tools, z3's second copy of libz3 (libz3.so; the run links it back
#                     to libz3.so.4.15). ~42 MB. (tilelang loads its HIP and Ascend stub libraries at import even on
#                     CUDA: without libstub_hip.so it fails, and so does `import fla` with it on the path.)
#
#   bash bench/make_hybrid_wheelhouse.sh        # from the project root, once .venv exists (~4 min: xz -9e)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
bash ../shared/gpu/make-wheelhouse.sh --no-ray .whl-hybrid
for d in .whl-hybrid .tl; do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
dl() { "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$1" "${@:2}"; }
dl .whl-hybrid flash-linear-attention==0.6.0 fla-core==0.6.0
if [ ! -f .tl/tilelang.tar.xz ]; then
  T=$(mktemp -d); mkdir -p "$T/w" "$T/site" .tl
  dl "$T/w" tilelang==0.1.15 apache-tvm-ffi==0.1.12 torch-c-dlpack-ext==0.1.5 z3-solver==4.15.4.0
  for w in "$T"/w/*.whl; do unzip -q -o "$w" -d "$T/site"; done
  (cd "$T/site" && rm -rf tilelang/3rdparty/tvm/src tilelang/3rdparty/cutlass/tools z3/lib/libz3.so \
     && tar cf - . | xz -9e -T0 > "$OLDPWD/.tl/tilelang.tar.xz")
  rm -rf "$T"
fi
du -sh .whl-hybrid .tl
