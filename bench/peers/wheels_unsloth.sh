#!/usr/bin/env bash
# .whl-peer-unsloth/: what bench/peers/unsloth_peer.py needs on the GPU machine beyond its image (Python 3.12,
# torch 2.11+cu130, transformers 5.17, accelerate, triton, pyarrow, pandas, xxhash, fsspec, protobuf, ...).
#
#   unsloth, unsloth_zoo 2026.10.9   the newest release; it pins transformers <= 5.17.0 (the image's exactly),
#                                    trl <= 1.15.0 and datasets < 5, so those two are older than .whl's
#   trl 1.15.0, datasets 4.8.5       the newest releases inside those pins (datasets excludes 4.0, 4.1.0, 4.4, 4.5.0)
#   peft 0.21.2, dill, multiprocess  what ../shared/gpu/make-wheelhouse.sh adds for datasets and peft too
#   bitsandbytes 0.50.2              cut to CUDA 13.0 by bench/make_bnb_wheel.sh: --quant 4bit, and adamw_8bit
#   xformers 0.0.35                  an Unsloth requirement on Linux; PyPI's wheel is built for torch 2.10 + CUDA
#                                    12.8 (its _C.so needs libcudart.so.12), so on the cu130 image it may not load:
#                                    Unsloth then says so and packed rows take SDPA, one call a segment (torch 2.11
#                                    has no varlen_attn with enable_gqa); unsloth_peer.py records which path ran.
#                                    NO_XFORMERS=1 leaves it out.
#
# The rest of Unsloth's Requires-Dist is left out: nothing a text LoRA run imports needs it. torchvision (7.5 MB;
# unsloth skips its torchvision check when it is absent, unsloth_zoo.vision_utils guards its import: vision models
# only; WITH_TORCHVISION=1 adds 0.26.0+cu130), torchao (unsloth_zoo: fp8 / QAT / saving paths, imported inside
# functions), cut_cross_entropy (unsloth_zoo sets UNSLOTH_ENABLE_CCE=0 on torch >= 2.8), msgspec (vLLM only), tyro,
# diffusers, hf_transfer (a download accelerator; the run is offline), sentencepiece (Qwen's tokenizer is BPE),
# and the CLI's typer / rich / structlog / json5.
# Unsloth's 28.6 MB wheel is 26 MB of `studio/` (its web UI, 82 MB unpacked) and the `unsloth_cli` command: both are
# dropped here, with their RECORD lines and the console script, as Ray's jars are in make-wheelhouse.sh.
#
#   bash bench/peers/wheels_unsloth.sh [DEST]     # from anywhere; needs .venv (for pip) and network to PyPI
#   # then carry [".whl-peer-unsloth"] and start the command with
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peer-unsloth .whl-peer-unsloth/*.whl \
#     && export PYTHONPATH=/tmp/peer-unsloth:$PYTHONPATH || exit 1
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.whl-peer-unsloth}
PY=${PYTHON:-.venv/bin/python}
UNSLOTH=${UNSLOTH:-2026.10.9}  # the fallback if it fails on the image: UNSLOTH=2026.10.1 TRL=1.13.0 (its pin)
TRL=${TRL:-1.15.0}
mkdir -p "$DEST"
for w in "$DEST"/unsloth-*.whl "$DEST"/unsloth_zoo-*.whl "$DEST"/trl-*.whl; do  # another version's, from a rerun
  case $(basename "$w") in "unsloth-$UNSLOTH-"*|"unsloth_zoo-$UNSLOTH-"*|"trl-$TRL-"*) ;; *) rm -f "$w";; esac
done
case "$DEST" in /*) ABS=$DEST;; *) ABS=$PWD/$DEST;; esac
dl() { "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$DEST" "$@" \
        2> >(grep -v "^WARNING: Location" >&2); }
[ -f "$DEST/unsloth-$UNSLOTH-py3-none-any.whl" ] || dl unsloth==$UNSLOTH  # stripped below: a rerun keeps it
dl unsloth_zoo==$UNSLOTH trl==$TRL datasets==4.8.5 peft==0.21.2 dill==0.4.1 multiprocess==0.70.19
if [ "${NO_XFORMERS:-0}" = 1 ]; then rm -f "$DEST"/xformers-*.whl; else dl xformers==0.0.35; fi
if [ "${WITH_TORCHVISION:-0}" = 1 ]; then dl torchvision==0.26.0; else rm -f "$DEST"/torchvision-*.whl; fi

# Unsloth without studio/ and unsloth_cli/: a new wheel of the same name whose RECORD lists only what it holds.
"$PY" - "$DEST/unsloth-$UNSLOTH-py3-none-any.whl" <<'EOF'
import os, sys, zipfile
path = sys.argv[1]
drop = ("studio/", "unsloth_cli/")
with zipfile.ZipFile(path) as src:
    names = src.namelist()
    if not any(n.startswith(drop) for n in names):
        print(f"{path}: already stripped"); sys.exit(0)
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            n = info.filename
            if n.startswith(drop) or n.endswith(".dist-info/entry_points.txt"):
                continue
            data = src.read(info)
            if n.endswith(".dist-info/RECORD"):
                keep = [line for line in data.decode().splitlines()
                        if not line.split(",", 1)[0].startswith(drop) and "entry_points.txt," not in line]
                data = ("\n".join(keep) + "\n").encode()
            out.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
os.replace(tmp, path)
kept = zipfile.ZipFile(path).namelist()
assert "unsloth/__init__.py" in kept and "unsloth/models/llama.py" in kept, "stripped too much"
print(f"{path}: dropped studio/ and unsloth_cli/, {len(kept)} files kept")
EOF
# An absolute DEST: it leaves .git/info/exclude alone. Tried twice: its `unzip -l | grep -q` under pipefail can fail
# when grep exits before unzip has written its last line (seen once here, silently).
bash bench/make_bnb_wheel.sh "$ABS" 130 || bash bench/make_bnb_wheel.sh "$ABS" 130

for w in "$DEST"/*.whl; do printf '%8.2f MiB  %s\n' "$(stat -c %s "$w" | awk '{print $1/1048576}')" "$(basename "$w")"; done
printf '%8.2f MiB  total\n' "$(cat "$DEST"/*.whl | wc -c | awk '{print $1/1048576}')"
