#!/usr/bin/env bash
# Issue 47's Hopper question in one Ray-free GPU run (bench/README.md, "Qwen3.5 packed"): does tilelang install on
# the image and run flash-linear-attention's backward, and what do packed and padded Qwen3.5 SFT steps run at beside
# the dense Qwen2.5-1.5B baseline, on each path. Carry [".whl-hybrid", ".tl"] (bench/make_hybrid_wheelhouse.sh):
#
#   bash bench/gpu_hybrid_call.sh [STEPS...]     # default: every step below, in order, inside BUDGET seconds
#
# Three Python paths, so one run compares them: /tmp/site (trl, peft, datasets...: no fla, so the PyTorch reference),
# + /tmp/site-fla (fla: its forward; its backward where the probe passes), + /tmp/site-tl (tilelang, which fla uses
# for the gated backward kernel it refuses on Hopper under Triton < 3.7.1). Results: $OUT/results.tgz after each step.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?the device run sets OUT}
W=${W:-/tmp/hyb}
mkdir -p "$W" /tmp/site-fla /tmp/site-tl
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl-hybrid/*.whl | grep -v -e fla_core -e flash_linear) 2>&1 | grep -v '^WARNING: Target' ; \
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-fla .whl-hybrid/fla_core*.whl .whl-hybrid/flash_linear*.whl 2>&1 | grep -v '^WARNING: Target'
T0=$SECONDS; tar xJf .tl/tilelang.tar.xz -C /tmp/site-tl && ln -sf libz3.so.4.15 /tmp/site-tl/z3/lib/libz3.so
echo "tilelang unpacked in $((SECONDS - T0)) s: $(du -sh /tmp/site-tl | cut -f1)"
export TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1
BASE=/tmp/site:${PYTHONPATH:-}; FLA=/tmp/site-fla:$BASE; TL=/tmp/site-tl:$FLA
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$W/gpu.txt"
python3 -c "import triton, torch; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$W/gpu.txt"
END=$((SECONDS + ${BUDGET:-570}))

step() {  # step NAME SECONDS PYTHONPATH COMMAND...
  local name=$1 limit=$2 path=$3 start=$SECONDS; shift 3
  (( limit > END - SECONDS - 5 )) && limit=$((END - SECONDS - 5))
  (( limit < 20 )) && { echo "== $name skipped: $limit s left"; return; }
  echo "PYTHONPATH=$path $*" >"$W/$name.cmd"
  PYTHONPATH=$path timeout "$limit" "$@" >"$W/$name.log" 2>&1
  echo "== $name rc $? in $((SECONDS - start)) s"; tail -4 "$W/$name.log" | cut -c1-300
  tar czf "$OUT/results.tgz" -C "$W" --exclude=models --exclude='prepared*' --exclude=corpus --exclude='run-*' .
}

sft() {  # NAME PATH MODEL PACKING STEPS [MORE ARGS]
  local name=$1 path=$2 model=$3 packing=$4 steps=$5; shift 5
  step "sft_$name" "${SFT_LIMIT:-150}" "$path" python3 bench/hybrid_sft.py --model "$model" --packing "$packing" \
    --steps "$steps" --warmup 2 --work "$W" --out "$W/sft_$name.json" "$@"
}

best() {  # the fastest path whose probe passed fla's backward: with tilelang, else fla alone (its forward); BEST=tl
  # takes tilelang's path without a probe step of its own (the stage's own probe still decides, in its process)
  if [ "${BEST:-}" = tl ] || grep -q '"backward": true' "$W/hybrid_kernels_tilelang.json" 2>/dev/null; then echo "$TL"; else echo "$FLA"; fi
}
probe_tl() { step probe_tilelang 150 "$TL" python3 bench/hybrid_kernels.py --out "$W/hybrid_kernels_tilelang.json"; }
probe_fla() { step probe_fla 90 "$FLA" python3 bench/hybrid_kernels.py --out "$W/hybrid_kernels_fla.json"; }
sft_dense() { sft dense_1.5b_packed "$BASE" qwen2.5-1.5b auto 12; }
sft_packed() { sft qwen3.5_packed_best "$(best)" qwen3.5-0.8b auto 12; }
sft_padded() { sft qwen3.5_padded_best "$(best)" qwen3.5-0.8b false 12; }  # TRL's layout: padded to the longest
# issue 47's padded-by-length target (>= 0.6x the dense packed): `packing: by_length`, the layout a refused packing
# trains, then the dense baseline in the same call
sft_by_length() {
  sft qwen3.5_by_length_best "$(best)" qwen3.5-0.8b by_length "${BY_LENGTH_STEPS:-12}" --stacks-every 100
  sft dense_1.5b_packed "$BASE" qwen2.5-1.5b auto 12
}
# The same runs with torch's profiler over steps 3-5 (hybrid_sft.py --profile); tokens/s from steps 7-16.
profile_packed() { sft qwen3.5_packed_profiled "$(best)" qwen3.5-0.8b auto 16 --profile 3; }
profile_dense() { sft dense_1.5b_packed_profiled "$BASE" qwen2.5-1.5b auto 16 --profile 3; }
profile_by_length() { sft qwen3.5_by_length_profiled "$(best)" qwen3.5-0.8b by_length 16 --profile 3 --stacks-every 100; }
# Compiled decoder layers (the token mixing eager inside them, hybrid/layers.py), both models, 30 steps.
sft_compiled() {
  sft qwen3.5_packed_compiled "$(best)" qwen3.5-0.8b auto 30 --compile true
  sft dense_1.5b_packed_compiled "$BASE" qwen2.5-1.5b auto 30 --compile true
}
sft_reference() { sft qwen3.5_packed_reference "$BASE" qwen3.5-0.8b auto 6; }
decode() {  # the static decode path (compiled, CUDA graphs) against generate's dynamic one, hybrid and dense
  for m in qwen3.5-0.8b qwen2.5-1.5b; do
    [ -d "$W/models/$m" ] || continue
    step "decode_$m" 150 "$(best)" python3 bench/generation_throughput.py --model-dir "$W/models/$m" --batches 16 \
      --paths merged,merged-static --out "$W/generation_$m.json"
  done
}
greedy() {  # the static path's greedy answers against generate's, bf16 (issue 47's correctness target)
  step greedy_equality 150 "$(best)" python3 bench/greedy_equality.py --model qwen3.5-0.8b --work "$W" \
    --out "$W/greedy_equality.json"
}
opd_chunked() {  # opd on the chunked JSD (issue 49): plan against peak, tokens/s, micro-batches 4, 2, 1
  step opd_chunked 240 "$BASE" python3 bench/opd_memory_check.py --model qwen2.5-1.5b --micro-batches 4 2 1 \
    --lmbdas 0 --steps 4 --out "$W/opd_chunked_1.5b.json"
}
opd_7b_teacher() {  # issue 49 item 3: a 7B teacher in NF4 beside a 1.5B student (carry .whl-bnb too)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-bnb/*.whl 2>&1 | grep -v '^WARNING: Target'
  step opd_7b_teacher 280 "$BASE" python3 bench/opd_memory_check.py --model qwen2.5-1.5b --teacher qwen2.5-7b \
    --teacher-quantization 4bit --micro-batches 2 1 --lmbdas 0 --steps 4 --out "$W/opd_7b_nf4_teacher.json"
}
pytest_best() {
  step pytest_hybrid 120 "$(best)" python3 -m pytest -q -p no:cacheprovider tests/stages/test_hybrid_packing.py \
    -k "trains_exactly or leaks or generation or installs or carry"
}

# The first run (2026-12-06): every step. Later runs name theirs.
all() { probe_tl; probe_fla; sft_dense; sft_packed; sft_padded; pytest_best; sft_reference; }

if [ $# = 0 ]; then all; else for s in "$@"; do "$s"; done; fi
