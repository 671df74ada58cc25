#!/usr/bin/env bash
# The next GPU session's bench commands (bench/README.md, "The next GPU session"), smoke-run here on the CPU with the
# tiny model under the GPU image's transformers (5.17; the project pins 5.24): an API that 5.17 lacks shows here, not
# in a 10-minute device call. transformers 5.17 and the huggingface_hub it needs (<2) go into a side site ($SITE,
# built once from PyPI) put in front of .venv's packages; everything else is .venv's.
#
#   bash bench/gpu_image_smoke.sh            # the bench smokes, ~2 min
#   bash bench/gpu_image_smoke.sh --tests    # and the whole test suite under 5.17 (~13 min on 2 cores)
#
# Found this way (2026-12-05): serve and the bench's continuous row raised TypeError on 5.17, whose
# ContinuousBatchingConfig calls the page size block_size (generation/continuous.py pool_config).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
SITE=${SITE:-/tmp/medgpt-ray-tf517}
OUT=${OUT:-/tmp/medgpt-ray-gpu-image-smoke}
if [ ! -d "$SITE/transformers" ]; then
  "$PY" -m pip install -q --no-deps --target "$SITE" transformers==5.17.0 huggingface_hub==1.33.0 httpx==0.29.0 \
    httpcore==1.0.9  # huggingface_hub 1.x reads the hub through httpx, which .venv (hub 2.x) lacks
fi
export PYTHONPATH="$SITE:$PWD" RAY_TRAIN_ENABLE_PRINT_PATCH=0
"$PY" -c 'import transformers; assert transformers.__version__ == "5.17.0", transformers.__version__'
TINY=$("$PY" -c 'from medgpt_ray.tiny import ensure_tiny; print(ensure_tiny())')
mkdir -p "$OUT"
failed=0
step() {  # step NAME JSON COMMAND...: run it, then any "error" in its JSON fails the smoke too
  local name=$1 json=$2; shift 2
  echo "== $name"
  if ! "$@" >"$OUT/$name.log" 2>&1; then
    echo "   FAILED (log: $OUT/$name.log)"; tail -5 "$OUT/$name.log"; failed=1; return
  fi
  if grep -q '"error"' "$json"; then
    echo "   a row failed:"; grep '"error"' "$json"; failed=1
  else
    echo "   ok"
  fi
}
step generation_throughput "$OUT/generation.json" "$PY" bench/generation_throughput.py --model-dir "$TINY" \
  --device cpu --batches 2 --new-tokens 8 --prompt-len 32 --profile --out "$OUT/generation.json"
step rl_stage_run "$OUT/rsr/rl_stage_run.json" "$PY" bench/rl_stage_run.py --model tiny --stages grpo \
  --train-steps 0 --steps 2 --num-generations 4 --prompts-per-step 1 --max-completion-length 16 \
  --set stages.grpo.seq_len=256 --set stages.grpo.generation_path=static --out "$OUT/rsr"
PORT=$("$PY" -c 'from tests.promserver import free_port; print(free_port())')
step serve_load "$OUT/serve_load.json" "$PY" bench/serve_load.py --model "$TINY" --clients 4 --max-tokens 8 \
  --port "$PORT" --out "$OUT/serve_load.json"
rm -rf "$OUT/decodable"
"$PY" bench/decodable_model.py --src "$TINY" --dest "$OUT/decodable" >"$OUT/decodable.log" 2>&1 \
  || { echo "== decodable_model FAILED (log: $OUT/decodable.log)"; failed=1; }
step serve_load_slots "$OUT/serve_load_slots.json" "$PY" bench/serve_load.py --model "$OUT/decodable" --clients 4 \
  --max-tokens 8 --port "$PORT" --engine slots --max-prompt-tokens 512 --max-tokens-limit 256 --stream-interval 4 \
  --rounds 3 --out "$OUT/serve_load_slots.json"
step chat_decode "$OUT/chat_decode.json" "$PY" bench/chat_decode.py --model-dir "$TINY" --device cpu --turns 2 \
  --new-tokens 8 --out "$OUT/chat_decode.json"
if [ "${1:-}" = "--tests" ]; then
  echo "== make test's suite under transformers 5.17"
  .venv/bin/pytest -q -p no:cacheprovider tests/unit tests/stages tests/ray tests/e2e || failed=1
fi
exit $failed
