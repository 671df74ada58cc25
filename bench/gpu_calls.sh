#!/usr/bin/env bash
# The device calls of bench/README.md "The next GPU session", one script so a call's command stays short and the
# committed results name the exact commands that made them. On the device machine, from the project root, with
# .whl and .whl-serve carried:
#
#   bash bench/gpu_calls.sh 1     # issue 35's four 1.5B targets (grpo, the static loop, generate, serve slots)
#   bash bench/gpu_calls.sh 2     # 7B grpo, serve's auto engine, the 1.5B static step's profile
#   bash bench/gpu_calls.sh 3     # Qwen3.5 LoRA residual (issue 34), chat's loop, the serving engines compared
#
# Each step has its own timeout (a call has 600 s) and writes its log and JSON under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?the device run sets OUT}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl-serve/*.whl || exit 1
export PYTHONPATH=/tmp/site:${PYTHONPATH:-} TORCH_CUDA_ARCH_LIST=9.0  # DeepSpeed's op builder fails on the image's 9.0a
M=/tmp/medgpt-rsr/models/qwen2.5-1.5b  # rl_stage_run builds it: random weights, the tokenizer
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

step() {  # step NAME SECONDS COMMAND...: its output in $OUT/NAME.log, its exit status and seconds printed
  local name=$1 limit=$2 start=$SECONDS; shift 2
  echo "$*" >"$OUT/$name.cmd"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name rc $? in $((SECONDS - start)) s"; tail -3 "$OUT/$name.log"
}

call1() {
  step grpo 190 python3 bench/rl_stage_run.py --model qwen2.5-1.5b --stages grpo --train-steps 0 --steps 6 \
    --num-generations 16 --prompts-per-step 1 --set stages.grpo.generation_path=static --out "$OUT/grpo"
  step loop 120 python3 bench/generation_throughput.py --model-dir "$M" --batches 16,64 \
    --paths merged-static,merged-static-generate --out "$OUT/generation_1.5b_loop.json"
  step generate 90 python3 -m medgpt_ray.cli generate --model "$M" --template chatml \
    --input data/sample/rl/department_prompts.jsonl --out "$OUT/gen" --max-new-tokens 128 --batch-size 64 --num-cpus 8
  step serve_slots 130 python3 bench/serve_load.py --model "$M" --clients 32 --max-tokens 256 --engine slots \
    --max-prompt-tokens 512 --max-tokens-limit 256 --out "$OUT/serve_load_1.5b_slots.json"
}

call2() {
  step grpo_7b 290 python3 bench/rl_stage_run.py --model qwen2.5-7b --stages grpo --train-steps 0 --steps 3 \
    --num-generations 16 --prompts-per-step 4 --set stages.grpo.generation_path=static --out "$OUT/7b"
  python3 -c "from pathlib import Path; from bench.generation_throughput import random_model; \
random_model('qwen2.5-1.5b', Path('/tmp/g'))"
  step serve_auto 130 python3 bench/serve_load.py --model /tmp/g/qwen2.5-1.5b --clients 32 --max-tokens 256 \
    --engine transformers --max-prompt-tokens 512 --max-tokens-limit 256 --out "$OUT/serve_load_1.5b_transformers.json"
  step profile 110 python3 bench/generation_throughput.py --model-dir /tmp/g/qwen2.5-1.5b --batches 16 \
    --paths merged-static --profile --out "$OUT/profile_1.5b.json"
}

call3() {
  step q35_lora 150 python3 bench/cuda_trace.py --family qwen3.5-0.8b --method lora --ckpt 1.0 --steps 2048 \
    --steps 836 --out "$OUT/q35_lora.json"
  step chat 120 python3 bench/chat_decode.py --shape qwen2.5-1.5b --turns 4 --new-tokens 256 \
    --out "$OUT/chat_decode_1.5b.json"
  step engines 250 python3 bench/generation_throughput.py --shape qwen2.5-1.5b --batches 16,64 \
    --paths merged-static-sdpa,continuous,continuous-graphs --out "$OUT/generation_1.5b_engines.json"
}

"call${1:?which call: 1, 2 or 3}"
