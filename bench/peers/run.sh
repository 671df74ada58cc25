#!/usr/bin/env bash
# Issue 50's side-by-side run, one peer per GPU run (bench/peers/README.md): our own run of the job first (the
# baseline, rerun in every GPU run), then the peer's, each in a process of its own with its own site directory, the
# same random-init model (saved once, by ours.py) and the same data, every process capped at 24 GiB.
#
#   bash bench/peers/run.sh PEER [MODEL] [PEER ARGS...]     # PEER: torchtune | unsloth | none; MODEL: qwen2.5-7b
#
# Carry [".whl-hybrid", ".whl-peer-PEER"] (bench/make_hybrid_wheelhouse.sh; bench/peers/wheels_PEER.sh). Our run
# takes .whl-hybrid's wheels (not fla: a dense model) in /tmp/site; the peer takes only its own, in /tmp/peer-PEER.
# DATA=FILE trains on a ShareGPT file of your own (MedicalGPT's medical_sft_1K_format.jsonl); by default the
# real-length mix of bench/make_real_length_corpus.py. OURS_LIMIT / PEER_LIMIT: seconds each process may take
# (240 / 330: one device call is 600 s). OURS_ARGS: more arguments to ours.py (`--method qlora` for the QLoRA row,
# with .whl-bnb carried: bench/make_bnb_wheel.sh .whl-bnb); TAG: a suffix for the result names (_qlora).
# OURS_WHEELS: our run's wheelhouse where .whl-hybrid is not carried (.whl, Ray's, has what ours.py needs too).
# Results: $OUT/peers.tgz after each step.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?the device run sets OUT}
PEER=${1:?torchtune, unsloth or none}; MODEL=${2:-qwen2.5-7b}; shift $(( $# < 2 ? $# : 2 ))
W=${W:-/tmp/peers}
mkdir -p "$W" /tmp/site "/tmp/peer-$PEER"
export TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  $(ls "${OURS_WHEELS:-.whl-hybrid}"/*.whl | grep -v -e fla_core -e flash_linear) $(ls .whl-bnb/*.whl 2>/dev/null) \
  2>&1 | grep -v '^WARNING: Target'
if [ "$PEER" != none ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "/tmp/peer-$PEER" .whl-peer-"$PEER"/*.whl \
    2>&1 | grep -v '^WARNING: Target'
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$W/gpu.txt"
python3 -m pip list 2>/dev/null >"$W/image_pip_list.txt"

step() {  # step NAME SECONDS PYTHONPATH COMMAND...: its log and command kept, the results packed after each
  local name=$1 limit=$2 path=$3 start=$SECONDS; shift 3
  echo "PYTHONPATH=$path $*" >"$W/$name.cmd"
  PYTHONPATH=$path timeout "$limit" "$@" >"$W/$name.log" 2>&1
  echo "== $name rc $? in $((SECONDS - start)) s"; grep -v Warning "$W/$name.log" | tail -5 | cut -c1-400
  tar czf "$OUT/peers.tgz" -C "$W" --exclude=models --exclude='prepared*' --exclude=corpus --exclude='run-*' \
    --exclude='work-*' .
}

DATA=${DATA:-}
if [ -z "$DATA" ]; then
  DATA=$W/corpus/sft.jsonl
  [ -f "$DATA" ] || PYTHONPATH=/tmp/site python3 bench/make_real_length_corpus.py --out "$W/corpus" --sft 3000 \
    --pref 10 >"$W/corpus.json"
fi
# OURS=0: the peer alone, where this warm machine already ran ours (its JSON is still in $W and packed again)
[ "${OURS:-1}" = 0 ] || step "ours_$MODEL${TAG:-}" "${OURS_LIMIT:-240}" /tmp/site python3 bench/peers/ours.py \
  --model "$MODEL" --data "$DATA" --work "$W" --out "$W/ours_$MODEL${TAG:-}.json" ${OURS_ARGS:-}
if [ "$PEER" != none ]; then
  step "${PEER}_$MODEL${TAG:-}" "${PEER_LIMIT:-330}" "/tmp/peer-$PEER" python3 "bench/peers/${PEER}_peer.py" \
    --model-dir "$W/models/$MODEL" --data "$DATA" --work "$W/work-$PEER" --out "$W/${PEER}_$MODEL${TAG:-}.json" "$@"
fi
ls -la "$W"
