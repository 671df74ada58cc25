#!/usr/bin/env bash
# The device calls of bench/README.md "The next GPU session", one script so a call's command stays short and the
# committed results name the exact commands that made them. On the device machine, from the project root, with
# .whl carried, and .whl-serve for the calls that serve or .whl-bnb (bench/make_bnb_wheel.sh) for a 4-bit model:
# a run carries 64 MiB, the working tree's ~6 MB included, so never both:
#
#   bash bench/gpu_calls.sh 1     # issue 35's 1.5B targets (grpo, the static loop, generate, serve on slots): ran
#                                 #   on an H100 on 2026-12-05 (bench/results/*_h100*.json)
#   bash bench/gpu_calls.sh 2     # serve, 32 clients, on a model whose tokens decode: slots with pieces of 1 and 4
#                                 #   tokens, transformers' engine with 4 (the comparison that picks `auto`)
#   bash bench/gpu_calls.sh 3     # the 7B grpo at 64 completions (>= 1,200 generated tokens/s), then the 1.5B profile
#   bash bench/gpu_calls.sh 4     # Qwen3.5 LoRA's peak on the GPU's allocator (issue 34)
#   bash bench/gpu_calls.sh 5     # chat on our loop; the serving engines in generation_throughput
#   bash bench/gpu_calls.sh 6     # issue 34: lora.experts on the 8-layer MoE; the planner's own (padded) Qwen3.5 plan
#   bash bench/gpu_calls.sh 8     # issue 47: grpo on Qwen3.5-0.8B beside the dense 1.5B, generation_path auto
#   bash bench/gpu_calls.sh 9     # issue 47: serve on slots, dense then Qwen3.5
#   bash bench/gpu_calls.sh 10    # issue 49: opd through the pipeline, a 7B NF4 teacher over the 1.5B (.whl-bnb)
#   bash bench/gpu_calls.sh 11    # issue 49: orpo and simpo on the chunked head; opd on the chunked JSD, sft teacher
#   bash bench/gpu_calls.sh 12    # issue 49: orpo and simpo, today's code then the baseline's (.base, carried)
#   bash bench/gpu_calls.sh 13    # issue 49: opd with the sft teacher, today's code then the baseline's (.base)
#   bash bench/gpu_calls.sh 14    # issue 48: a compiled sft's first step, cold caches then warm (the same config)
#   bash bench/gpu_calls.sh 15    # issue 47: call 8 on the 64 widest prompts, the plan's worst case: peak vs plan
#   bash bench/gpu_calls.sh 16    # issue 48: the 8-layer Qwen3-MoE sft (the issue's 115 s first step, 13.77 GiB
#                                 #   over a plan of 13.28): first step cold then warm, peak against today's plan
#   bash bench/gpu_calls.sh 17    # issue 49 item 6: opd on the 64 widest conversations, every micro-batch as wide as
#                                 #   the plan prices it: peak vs plan (call 13's ran 14 % under, on narrower steps)
#   bash bench/gpu_calls.sh 19    # issue 50: the throughput model on compiled layers, 7B and 1.5B points pinned
#   bash bench/gpu_calls.sh 18    # issue 48: a stage's start-up piece by piece (bench/startup_split.py: imports, a
#                                 #   no-op Ray Train fit, the model's load; ours.py --profile-startup cold and warm)
#
# Calls 12 and 13 rerun the issue's baseline in the same call: bench/make_baseline_tree.sh writes .base/ (the
# package before issue 49's chunked losses, today's bench scripts beside it); carry .whl and .base.
#
# A call brings back at most 8 files: each step writes its command, log and JSON under $W, and after every step
# $OUT/results.tgz is remade from it (Ray Data's parquet parts left out), so a call cut short keeps what finished.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?the device run sets OUT}
W=${W:-/tmp/calls}
mkdir -p "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  $(ls .whl-serve/*.whl .whl-bnb/*.whl 2>/dev/null) 2>&1 | grep -v '^WARNING: Target directory' ; [ "${PIPESTATUS[0]}" = 0 ] || exit 1
export PYTHONPATH=/tmp/site:${PYTHONPATH:-} TORCH_CUDA_ARCH_LIST=9.0  # DeepSpeed's op builder fails on the image's 9.0a
M=/tmp/medgpt-rsr/models/qwen2.5-1.5b  # rl_stage_run builds it: random weights, the tokenizer
G=/tmp/g/qwen2.5-1.5b  # the same shape, built by generation_throughput.random_model
D=/tmp/g/qwen2.5-1.5b-decodable  # and its tokens decoding to text (bench/decodable_model.py): serve_load's
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$W/gpu.txt"

# A warm machine keeps /tmp between calls: the peers' 7B runs (/tmp/peers, ~29 GB), rl_stage_run's and the
# throughput runs' models and run directories filled its 64 GiB disk on 2026-12-07 and call 9's model save failed.
# Below 30 GiB free, the earlier calls' work directories go (the models a call needs are rebuilt; /tmp/site stays).
if (( $(df -k --output=avail /tmp | tail -1) < 30 * 1024 * 1024 )); then
  echo "== /tmp has $(df -h --output=avail /tmp | tail -1 | tr -d ' ') free: removing the earlier calls' work directories"
  rm -rf /tmp/peers /tmp/rlt /tmp/rlt_* /tmp/rsr_* /tmp/medgpt-rsr /tmp/g /tmp/ss /tmp/calls_*
fi

# make_baseline_tree.sh leaves data/sample/*.jsonl out of .base/ where they equal the tree's: copy the tree's in.
if [ -d .base/medgpt_ray ] && [ ! -d .base/data/sample ]; then
  mkdir -p .base/data/sample && cp data/sample/*.jsonl .base/data/sample/
fi

END=$((SECONDS + ${BUDGET:-580}))  # BUDGET: the seconds this call may run (a step is cut to what is left of them)

step() {  # step NAME SECONDS COMMAND...: output in $W/NAME.log; its exit status and seconds printed
  local name=$1 limit=$2 start=$SECONDS; shift 2
  (( limit > END - SECONDS - 5 )) && limit=$((END - SECONDS - 5))
  (( limit < 30 )) && { echo "== $name skipped: $limit s left"; return; }
  echo "$*" >"$W/$name.cmd"
  timeout "$limit" "$@" >"$W/$name.log" 2>&1
  echo "== $name rc $? in $((SECONDS - start)) s"; tail -3 "$W/$name.log" | cut -c1-400
  tar czf "$OUT/results.tgz" -C "$W" --exclude='*.parquet' --exclude='*.safetensors' .
}

random_1_5b() {  # the 1.5B shape with random weights where rl_stage_run would not build it
  [ -d "$G" ] || python3 -c "from pathlib import Path; from bench.generation_throughput import random_model; \
random_model('qwen2.5-1.5b', Path('/tmp/g'))"
}

model_1_5b() {  # that, and its decodable copy
  random_1_5b
  [ -d "$D" ] || python3 bench/decodable_model.py --src "$G" --dest "$D"
}

corpus() {  # the peers' real-length SFT mix (bench/make_real_length_corpus.py) in /tmp/ss/corpus, for ours.py
  [ -f /tmp/ss/corpus/sft.jsonl ] || python3 bench/make_real_length_corpus.py --out /tmp/ss/corpus --sft 3000 \
    --pref 10 >/dev/null
}

grpo_1_5b() {  # STEPS
  step grpo 190 python3 bench/rl_stage_run.py --model qwen2.5-1.5b --stages grpo --train-steps 0 --steps "$1" \
    --num-generations 16 --prompts-per-step 1 --set stages.grpo.generation_path=static --out "$W/grpo"
}

serve() {  # ENGINE MODEL [STREAM_INTERVAL]
  step "serve_$1_${3:-1}" 130 python3 bench/serve_load.py --model "$2" --clients 32 --max-tokens 256 --engine "$1" \
    --max-prompt-tokens 512 --max-tokens-limit 256 --stream-interval "${3:-1}" --rounds 3 \
    --out "$W/serve_load_1.5b_$1_${3:-1}.json"
}

call1() {
  grpo_1_5b 6
  step loop 120 python3 bench/generation_throughput.py --model-dir "$M" --batches 16,64 \
    --paths merged-static,merged-static-generate --out "$W/generation_1.5b_loop.json"
  step generate 90 python3 -m medgpt_ray.cli generate --model "$M" --template chatml \
    --input data/sample/rl/department_prompts.jsonl --out "$W/gen" --max-new-tokens 128 --batch-size 64 --num-cpus 8
  serve slots "$M"
}

call2() {
  model_1_5b
  serve slots "$D" 1
  serve slots "$D" 4
  serve transformers "$D" 4
}

call3() {  # the 7B's first step builds and compiles (~2 min); the profile after it if time is left
  step grpo_7b 420 python3 bench/rl_stage_run.py --model qwen2.5-7b --stages grpo --train-steps 0 --steps 3 \
    --num-generations 16 --prompts-per-step 4 --set stages.grpo.generation_path=static --out "$W/7b"
  profile_1_5b
}

profile_1_5b() {
  model_1_5b
  step profile 110 python3 bench/generation_throughput.py --model-dir "$G" --batches 16 --paths merged-static \
    --profile --out "$W/profile_1.5b.json"
}

call4() {
  step q35_lora 150 python3 bench/cuda_trace.py --family qwen3.5-0.8b --method lora --ckpt 1.0 --steps 2048 \
    --steps 836 --out "$W/q35_lora.json"
}

call5() {
  step chat 120 python3 bench/chat_decode.py --shape qwen2.5-1.5b --turns 4 --new-tokens 256 \
    --out "$W/chat_decode_1.5b.json"
  step engines 250 python3 bench/generation_throughput.py --shape qwen2.5-1.5b --batches 16,64 \
    --paths merged-static-sdpa,continuous,continuous-graphs --out "$W/generation_1.5b_engines.json"
}

call6() {
  step moe_experts 240 python3 bench/real_length_throughput.py --model qwen3-moe-8l --stages sft --steps 6 \
    --sft-records 1000 --set stages.sft.lora.experts=true --set stages.sft.lora.dropout=0 --out "$W/moe-experts"
  step q35_lora_plan 220 python3 bench/real_length_throughput.py --model qwen3.5-0.8b --stages sft --steps 3 \
    --warmup 1 --sft-records 300 --out "$W/q35-lora-plan"
}

call7() {  # call 6's MoE run without Liger: its SwiGLU kernel reads the experts' hidden_dim, which PEFT's wrapper hides
  step moe_experts_nofused 280 python3 bench/real_length_throughput.py --model qwen3-moe-8l --stages sft --steps 6 \
    --sft-records 1000 --set stages.sft.lora.experts=true --set stages.sft.lora.dropout=0 \
    --set stages.sft.fused_kernels=false --out "$W/moe-experts-nofused"
}

grpo_auto() {  # NAME MODEL STEPS: grpo through the pipeline, 16 x 256, generation_path auto (issue 47's grpo target)
  step "grpo_$1" 240 python3 bench/rl_stage_run.py --model "$2" --stages grpo --train-steps 0 --steps "$3" \
    --num-generations 16 --prompts-per-step 1 --set stages.grpo.generation_path=auto --out "$W/grpo_$1"
}

decodable() {  # MODEL: random weights of MODEL (call 8's on a warm machine, else built here) made decodable
  local src=/tmp/medgpt-rsr/models/$1  # (serve_load's time to first token needs text)
  if [ ! -d "$src" ]; then
    src=/tmp/g/$1
    [ -d "$src" ] || python3 -c "from pathlib import Path; from bench.generation_throughput import random_model; \
random_model('$1', Path('/tmp/g'))"
  fi
  [ -d "/tmp/g/$1-decodable" ] || python3 bench/decodable_model.py --src "$src" --dest "/tmp/g/$1-decodable"
}

call8() {  # issue 47: Qwen3.5-0.8B grpo beside the dense 1.5B, both through the pipeline on this machine
  grpo_auto dense_1.5b qwen2.5-1.5b 6
  grpo_auto qwen3.5_0.8b qwen3.5-0.8b 6
}

call9() {  # issue 47: serve on slots, 32 clients x 256, dense then hybrid (call 8's models where it ran first)
  decodable qwen2.5-1.5b; decodable qwen3.5-0.8b
  serve slots /tmp/g/qwen2.5-1.5b-decodable 1
  step serve_hybrid 130 python3 bench/serve_load.py --model /tmp/g/qwen3.5-0.8b-decodable --clients 32 \
    --max-tokens 256 --engine slots --max-prompt-tokens 512 --max-tokens-limit 256 --stream-interval 1 --rounds 3 \
    --out "$W/serve_load_qwen3.5-0.8b_slots_1.json"
}

call10() {  # issue 49 item 3: opd, a 7B teacher in NF4 beside the 1.5B student, planned and run through the pipeline
  step opd_7b_teacher 280 python3 bench/rl_stage_run.py --model qwen2.5-1.5b --stages opd --teacher qwen2.5-7b \
    --teacher-quantization 4bit --train-steps 0 --steps "${STEPS:-20}" --max-completion-length 128 --out "$W/opd_7b"
}

call11() {  # issue 49: orpo and simpo on the chunked head (the H200's committed full-logit medians: 7,923 / 7,971), then
  # opd on the chunked JSD, 1.5B student and the run's sft as its teacher (today 242-455 tokens/s at micro-batch 1)
  step orpo_simpo 230 python3 bench/real_length_throughput.py --model qwen2.5-1.5b --stages orpo,simpo --steps 10 \
    --workdir /tmp/rlt --out "$W/orpo_simpo"
  step opd_sft_teacher 300 python3 bench/rl_stage_run.py --model qwen2.5-1.5b --stages opd --train-steps 2 --steps 8 \
    --max-completion-length 128 --out "$W/opd"
}

base() {  # NAME LIMIT SCRIPT ARGS...: SCRIPT from .base/benchnow, so it imports the baseline's medgpt_ray
  local name=$1 limit=$2 script=$3; shift 3
  [ -f .base/REV ] || { echo "== $name skipped: no .base (bench/make_baseline_tree.sh; carry .base)"; return; }
  cp .base/REV "$W/base_rev.txt"
  step "$name" "$limit" bash -c 'cd .base && exec python3 "benchnow/$0" "$@"' "$script" "$@"
}

shared_models() {  # WORKDIR_A WORKDIR_B: B reads the random weights A built (the same shape, built once)
  mkdir -p "$1/models" "$2"; [ -e "$2/models" ] || ln -s "$1/models" "$2/models"
}

call12() {  # issue 49's orpo/simpo target: >= 1.5x the baseline's tokens/s each, both measured in this call
  # The baseline plans simpo in QLoRA: without bitsandbytes it stops before its first step (2026-12-07,
  # bench/results/orpo_simpo_16steps_h100/). Carry .whl, .base and .whl-bnb (~63.3 of a run's 64 MiB with the tree).
  python3 -c "import bitsandbytes" 2>/dev/null || { echo "call 12 needs bitsandbytes: carry .whl-bnb too"; exit 2; }
  shared_models /tmp/rlt /tmp/rlt_base
  # STEPS/WARMUP: 8/2 ran on 2026-12-07 (bench/results/orpo_simpo_chunked_h100/): the chunked runs' steps 3-4 were
  # still warming up, so the next run leaves 4 out of 16
  # simpo first (orpo's 2.30x is met; a call cut short keeps simpo's pair). Today's orpo/simpo compile on `auto` for a
  # full run (bucketed lengths), which the bench pins: ~40 s more a stage for the first step's compile.
  step orpo_simpo 330 python3 bench/real_length_throughput.py --model qwen2.5-1.5b --stages "${STAGES:-simpo,orpo}" \
    --steps "${STEPS:-16}" --warmup "${WARMUP:-4}" --workdir /tmp/rlt --out "$W/orpo_simpo"
  base orpo_simpo_base 250 real_length_throughput.py --model qwen2.5-1.5b --stages "${STAGES:-simpo,orpo}" \
    --steps "${STEPS:-16}" --warmup "${WARMUP:-4}" --workdir /tmp/rlt_base --out "$W/orpo_simpo_base"
}

call13() {  # issue 49's opd target: micro-batch >= 4 and >= 4x the baseline's training tokens/s, both in this call
  shared_models /tmp/medgpt-rsr /tmp/rsr_base
  # STEPS: 8 ran on 2026-12-07 (bench/results/opd_chunked_h100/); more let the decode step's compile amortize
  step opd_sft_teacher 270 python3 bench/rl_stage_run.py --model qwen2.5-1.5b --stages opd --train-steps 2 \
    --steps "${STEPS:-16}" --max-completion-length 128 --out "$W/opd"
  base opd_base 290 rl_stage_run.py --model qwen2.5-1.5b --stages opd --train-steps 2 --steps "${STEPS:-16}" \
    --max-completion-length 128 --workdir /tmp/rsr_base --out "$W/opd_base"
}

cold_warm() {  # NAME MODEL COLD_LIMIT [--set ...]: one sft config twice, the second run on the compile caches the
  # first left under the cache dir (its own workdir, the same models); each result.json's startup_s holds the seconds
  # from the stage's start line to its worker, its trainer and its first step's end
  local name=$1 model=$2 limit=$3; shift 3
  shared_models /tmp/rlt "/tmp/rlt_${name}_warm"
  for run in cold warm; do
    local dir=/tmp/rlt; [ "$run" = warm ] && dir="/tmp/rlt_${name}_warm"
    step "${name}_${run}" "$limit" python3 bench/real_length_throughput.py --model "$model" --stages sft --steps 3 \
      --warmup 1 --sft-records 1000 "$@" --workdir "$dir" --out "$W/${name}_${run}"
    limit=200
  done
}

call14() {  # issue 48: a compiled 1.5B sft's first step, cold caches then warm. Run on a fresh machine.
  cold_warm first_step qwen2.5-1.5b 200 --set stages.sft.compile=true
}

call15() {  # issue 47: peaks within max(10 %, 0.5 GiB) of the plan, which prices the split's widest prompt
  for m in ${MODELS:-dense_1.5b:qwen2.5-1.5b qwen3.5_0.8b:qwen3.5-0.8b}; do  # MODELS: NAME:PRESET ...
    step "grpo_widest_${m%%:*}" 240 python3 bench/rl_stage_run.py --model "${m#*:}" --stages grpo --train-steps 0 \
      --steps 5 --num-generations 16 --prompts-per-step 1 --widest-prompts 64 \
      --set stages.grpo.generation_path=auto --out "$W/grpo_widest_${m%%:*}"
  done
}

call16() {  # issue 48 item 11 on its own model: the planner's plan as it chooses it (compile on auto), twice
  cold_warm moe_first_step qwen3-moe-8l 260
}

call17() {  # issue 49 item 6: opd's peak within max(10 %, 0.5 GiB) of its plan, at the plan's own width
  step opd_widest 300 python3 bench/rl_stage_run.py --model qwen2.5-1.5b --stages opd --train-steps 2 --steps 6 \
    --max-completion-length 128 --widest-prompts 64 --workdir /tmp/rsr_widest --out "$W/opd_widest"
}

call18() {  # issue 48: where the ~25 s before a stage's worker is up go, and the rest of its first step, piece by piece
  random_1_5b
  step startup_split 420 python3 bench/startup_split.py --model "$G" --out "$W/startup_split.json"
  corpus
  for t in cold warm; do  # the same 1.5B sft, compiled, twice: the second finds the compile caches
    step "ours_startup_$t" 150 python3 bench/peers/ours.py --model-dir "$G" --data /tmp/ss/corpus/sft.jsonl \
      --steps 2 --work /tmp/ss --out "$W/ours_startup_$t.json" --profile-startup
  done
}

call19() {  # the throughput model on compiled layers: one model, micro-batch and checkpoint share pinned, point by point
  # The eager launch cost (40 us an op) put the 7B's compiled steps at 0.85/1.18 s where they took 0.595/0.574 s
  # (peers_h100_call2/, peers_h100_mb1/) and ranked them the wrong way round, while compiled 1.5B runs fit it:
  # the points below separate a per-op host cost from a per-token cost that narrow layers pay.
  corpus
  for point in ${POINTS:-qwen2.5-7b:1:0.54 qwen2.5-7b:1:1 qwen2.5-7b:3:1 qwen2.5-1.5b:1:0.5 qwen2.5-1.5b:3:0.5 \
      qwen2.5-1.5b:3:1}; do
    IFS=: read -r m mb ck <<<"$point"
    step "fit_${m}_mb${mb}_ck${ck}" 150 python3 bench/peers/ours.py --model "$m" --data /tmp/ss/corpus/sft.jsonl \
      --steps 12 --micro-batch "$mb" --grad-ckpt "$ck" --work /tmp/ss --out "$W/fit_${m}_mb${mb}_ck${ck}.json"
  done
}

"call${1:?which call: 1 to 19}"
