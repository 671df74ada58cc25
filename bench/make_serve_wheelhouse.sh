#!/usr/bin/env bash
# .whl-serve/: what `serve` and bench/serve_load.py need on the GPU machine beyond ../shared/gpu/make-wheelhouse.sh's
# .whl (ray without its serve extras). The image (2026-12-05, pip list) has aiohttp, grpcio, protobuf, requests,
# httpx, pyyaml, click and psutil, but no fastapi, starlette, uvicorn, openai or prometheus-client. These are
# ray[serve]'s extras (grpcio-reflection too, which serve imports even for HTTP, at the image's grpcio 1.84.0: its
# generated code refuses an older grpcio) and the OpenAI client, pinned to .venv's versions. Left out to stay inside
# a run's 64 MiB with .whl (~51 MB; bitsandbytes is .whl-bnb, carried instead where a call needs it) and the working
# tree (~6 MB): virtualenv, py-spy, uvloop (ray's runtime environments, profiling, an optional event loop) and
# watchfiles (only `serve run --reload` imports it).
#
#   bash bench/make_serve_wheelhouse.sh        # from the project root, once .venv exists
#   # then carry [".whl", ".whl-serve"] and install both: ... --target /tmp/site .whl/*.whl .whl-serve/*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.whl-serve}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$DEST"
grep -qx "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >> .git/info/exclude
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform any -d "$DEST" \
  fastapi==0.165.0 annotated-doc==0.0.7 starlette==1.10.0 uvicorn==0.55.0 sniffio==1.3.1 openai==3.51.0 \
  httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 jiter==0.19.0 opentelemetry-api==1.45.2 \
  opentelemetry-sdk==1.45.2 opentelemetry-exporter-prometheus==0.66b2 opentelemetry-proto==1.45.2 \
  opentelemetry-semantic-conventions==0.66b2 prometheus-client==0.26.0 aiohttp-cors==0.8.1 colorful==0.5.8 \
  opencensus==0.11.4 opencensus-context==0.1.3 smart-open==9.0.4 wrapt==2.5.2 google-api-core==2.44.0 \
  proto-plus==1.29.0 googleapis-common-protos==1.76.0 google-auth==2.63.0 pyasn1==0.6.5 pyasn1-modules==0.4.2 \
  websockets==17.4 httptools==0.9.0 python-dotenv==1.2.4 grpcio-reflection==1.84.0
du -sh "$DEST"
