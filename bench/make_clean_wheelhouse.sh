#!/usr/bin/env bash
# Build .whl-clean/ : what the GPU machine's image lacks to run the cleaner (bench/clean_throughput.py):
# ray (Java jars, RLlib and the dashboard's source maps stripped), jieba without the parts `lcut` never
# loads (posseg, lac_small, analyse: 19 MB -> ~8 MB), pydantic and jsonschema. The image has pyarrow,
# numpy, psutil and pyyaml. py-spy (3 MB) for `clean_throughput.py --profile`. Run from the project root once .venv exists; carry ".whl-clean" and start with
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-clean/*.whl \
#     && python3 -m compileall -q -j 0 /tmp/site \
#     && export PYTHONPATH=/tmp/site:$PYTHONPATH PATH=/tmp/site/bin:$PATH || exit 1;
set -euo pipefail
DEST=${1:-.whl-clean}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
mkdir -p "$DEST"
grep -qx "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >> .git/info/exclude
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform any)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
  -d "$DEST" ray==2.60.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types typing-inspection==0.4.5 \
  jsonschema==4.26.0 jsonschema-specifications referencing==0.37.0 rpds-py py-spy==0.4.0
# jieba ships only as a source archive (pure Python): build its wheel here, then drop what lcut never loads.
ls "$DEST"/jieba-*.whl >/dev/null 2>&1 || "$PY" -m pip wheel -q --no-deps -w "$DEST" jieba==0.42.1
for w in "$DEST"/jieba-*.whl; do zip -q -d "$w" 'jieba/posseg/*' 'jieba/lac_small/*' 'jieba/analyse/*' >/dev/null 2>&1 || true; done
for w in "$DEST"/ray-*.whl; do
  zip -q -d "$w" 'ray/jars/*' 'ray/rllib/*' 'ray/dashboard/client/build/static/js/*.map' >/dev/null 2>&1 || true
done
du -sh "$DEST"; ls "$DEST"
