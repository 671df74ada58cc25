#!/usr/bin/env bash
# .whl-peer-torchtune/ : what bench/peers/torchtune_peer.py needs that the GPU image (Python 3.12, torch 2.11,
# transformers 5.17, huggingface_hub, safetensors, numpy, tqdm, psutil, regex, requests, PyYAML, pyarrow, pandas)
# lacks, as Python 3.12 / x86-64 wheels (~20 MB in all, well under a run's 64 MiB):
#
#   torchtune 0.6.1          the recipe (recipes/ ships inside its wheel); its METADATA asks for torchdata==0.11.0,
#                            datasets, huggingface_hub[hf_transfer], safetensors, kagglehub, sentencepiece, tiktoken,
#                            blobfile>=2, tokenizers, numpy, tqdm, omegaconf, psutil, Pillow>=9.4.0
#   torchao 0.15.0           `import torchtune` imports torchao.quantization.int4_weight_only (training/quantization.py):
#                            0.15.0 is the last torchao that exports it (0.16 removed it). Its C++ ops are built
#                            against torch 2.9.1; under torch 2.11 (or 2.13 here) its __init__ skips loading them
#                            ("incompatible torch version") and the Python API (NF4Tensor, quantize_) loads as usual.
#   torchdata 0.11.0         StatefulDataLoader (pinned by torchtune)
#   omegaconf 2.3.0 + antlr4-python3-runtime 4.9.3   the recipe's config; antlr4 4.9.3 is an sdist only: built here
#   tiktoken, sentencepiece  imported by `import torchtune` (its tokenizers package), unused by the Qwen2.5 tokenizer
#   pillow                   imported by `import torchtune` (its CLIP transforms); in case the image lacks it
#   datasets 5.2.0, dill, multiprocess   chat_dataset's load_dataset("json"), copied from .whl-hybrid when there
# Left out: kagglehub (only `tune download` imports it), blobfile (tiktoken imports it only for remote files),
# hf_transfer (optional).
#
#   bash bench/peers/wheels_torchtune.sh      # from the project root, once .venv exists
# The driver installs them with
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peer-torchtune .whl-peer-torchtune/*.whl
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
DEST=.whl-peer-torchtune
mkdir -p "$DEST"
dl() { "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$DEST" "$@"; }
dl torchtune==0.6.1 torchao==0.15.0 torchdata==0.11.0 omegaconf==2.3.0 tiktoken==0.14.0 sentencepiece==0.2.3 \
   pillow==13.0.0
if ! ls "$DEST"/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1; then
  "$PY" -m pip wheel -q --no-deps --no-binary=:all: -w "$DEST" antlr4-python3-runtime==4.9.3
fi
for w in datasets-5.2.0 dill-0.4.1 multiprocess-0.70.19; do
  if ls "$DEST/$w"-*.whl >/dev/null 2>&1; then :
  elif ls .whl-hybrid/"$w"-*.whl >/dev/null 2>&1; then cp .whl-hybrid/"$w"-*.whl "$DEST"/
  else dl "${w/-/==}"; fi
done
ls -l "$DEST" | awk 'NR > 1 {printf "%10d  %s\n", $5, $9}'
du -cb "$DEST"/*.whl | tail -1 | awk '{printf "total: %d bytes (%.1f MiB)\n", $1, $1 / 2^20}'
