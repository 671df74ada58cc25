"""Driver memory of the pipeline's data preparation (`data/prepare.py`'s prepare_kind: read, convert, split, write
the train/held-out Parquet files) on an SFT corpus of N records, in a fresh process per size: peak RSS, wall
time, counts.

    .venv/bin/python bench/prepare_rss.py --records 100000 1000000 --out bench/results/prepare_rss.json

The corpus comes from make_dirty_corpus.py (MedicalGPT ShareGPT lines, ~0.1 % malformed; generated once into
--work). The results JSON is rewritten after every size. --module runs another copy of prepare.py (a file path)
instead, to measure an older version the same way.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_support import corpus  # noqa: E402  (bench/ is the script's own folder)


def child(path: str, out_dir: str, module: str | None) -> None:
    if module:
        import importlib.util

        spec = importlib.util.spec_from_file_location("prepare_under_test", module)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # its dataclasses look their module up
        spec.loader.exec_module(mod)
        prepare_kind = mod.prepare_kind
    else:
        from medgpt_ray.data.prepare import prepare_kind
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    d = prepare_kind("sft", [path], Path(out_dir), 0.05)
    print(json.dumps({"wall_s": round(time.monotonic() - t0, 1), "source_records": d.source_records,
                      "train_records": d.train_records, "eval_records": d.eval_records, "quarantined": d.quarantined,
                      "rss_before_mib": round(base / 1024, 1),
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, nargs="+", default=[100_000])
    p.add_argument("--work", default="/tmp/medgpt-clean-bench")
    p.add_argument("--out", help="results JSON (required unless --child)")
    p.add_argument("--module", help="path of another prepare.py to measure instead of the installed one")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(*args.child, args.module)
        return
    if not args.out:
        p.error("--out is required")
    results = {"command": "python " + " ".join(sys.argv), "module": args.module or "medgpt_ray/data/prepare.py",
               "python": platform.python_version(), "runs": []}
    for n in args.records:
        path = corpus(n, Path(args.work))
        out_dir = Path(args.work) / f"prepared_{n}"
        cmd = [sys.executable, __file__, "--child", str(path), str(out_dir),
               *(["--module", args.module] if args.module else [])]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        run = {"records": n, "corpus_mib": round(path.stat().st_size / 2**20, 1), **json.loads(r.stdout)}
        results["runs"].append(run)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"[bench] {n:,} records: peak RSS {run['peak_rss_mib']:,.0f} MiB in {run['wall_s']}s", flush=True)


if __name__ == "__main__":
    main()
