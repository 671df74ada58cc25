"""What this machine runs a hybrid's linear attention on (issue 47 items 1 and 3): the versions that decide it (torch,
Triton, transformers, flash-linear-attention, tilelang) and hybrid/kernels.probe's answer: fla's delta rule and
causal convolution, forward and backward, on small packed bf16 inputs against transformers' PyTorch reference.

    python3 bench/hybrid_kernels.py --out $OUT/hybrid_kernels.json      # on the GPU machine, Ray-free
    (bench/gpu_hybrid_call.sh runs it with and without tilelang on the path)
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def version(module: str) -> str | None:
    try:
        return getattr(importlib.import_module(module), "__version__", "?")
    except Exception as e:  # reported, not raised: what is missing is the answer
        return f"not importable: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from medgpt_ray.hybrid import kernels

    doc = {"command": " ".join(sys.argv), "versions": {m: version(m) for m in
                                                        ("torch", "triton", "transformers", "fla", "tilelang")}}
    t0 = time.monotonic()
    doc["probe"] = kernels.probe().as_dict()
    doc["probe_seconds"] = round(time.monotonic() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
