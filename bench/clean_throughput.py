"""Cleaning throughput: records/s of the Ray Data pipeline on 1 and 2 CPUs, against a single-process loop
running the same operators, with peak memory of the driver and of the Ray workers.

    python bench/clean_throughput.py --records 100000 --cpus 1 2 --baseline \
        --out bench/results/clean_throughput_100k.json
    python bench/clean_throughput.py --records 1000000 --cpus 2 --out bench/results/clean_throughput_1m.json

The corpus comes from bench/make_dirty_corpus.py (generated once into --work and reused).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def corpus(records: int, work: Path) -> Path:
    path = work / f"dirty_{records}.jsonl"
    if not path.is_file():
        work.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")  # an interrupted generation must not pass for a corpus
        subprocess.run([sys.executable, str(REPO / "bench" / "make_dirty_corpus.py"), "--records", str(records),
                        "--out", str(tmp)], check=True, stdout=subprocess.DEVNULL)
        tmp.rename(path)
    return path


class PeakRSS:
    """Samples the RSS of this process and of every descendant (the Ray workers) twice a second."""

    def __init__(self) -> None:
        self.driver = 0
        self.worker = 0
        self.total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            try:
                kids = me.children(recursive=True)
                driver = me.memory_info().rss
                workers = [k.memory_info().rss for k in kids if "ray::" in " ".join(k.cmdline()[:1])
                           or k.name().startswith("ray::")]
                self.driver = max(self.driver, driver)
                self.worker = max(self.worker, max(workers, default=0))
                self.total = max(self.total, driver + sum(k.memory_info().rss for k in kids))
            except psutil.Error:
                pass
            time.sleep(0.5)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def baseline(path: Path, records_limit: int | None = None) -> dict:
    """The same operators in a plain loop: read -> convert -> clean -> dedup features -> bucket marking."""
    import numpy as np
    import pyarrow.compute as pc

    from medgpt_ray.config import CleanConfig
    from medgpt_ray.data.chunks import plan_chunks, read_chunk
    from medgpt_ray.data.convert import convert_rows, rows_to_table
    from medgpt_ray.data.ops.dedup import dedup_features
    from medgpt_ray.data.ops.record import clean_table

    cfg = CleanConfig()
    t0 = time.monotonic()
    source, kept, buckets, dups = 0, 0, defaultdict(list), 0
    batch: list[dict] = []

    def flush() -> None:
        nonlocal kept, dups
        table = rows_to_table(convert_rows(batch, cfg.pii))
        live = table.filter(pc.is_null(table["dropped_by"]))
        cleaned = clean_table(live, "sft", cfg)
        ok = cleaned.filter(pc.is_null(cleaned["dropped_by"]))
        feats = dedup_features(ok, "sft", cfg.dedup)
        for xh, bands, sig in zip(feats["exact_hash"].to_pylist(), feats["band_keys"].to_pylist(),
                                  feats["minhash"].to_pylist(), strict=True):
            s = np.frombuffer(sig, dtype=np.uint64)
            dup = bool(buckets.get("x" + xh)) or any(
                float(np.mean(s == other)) >= cfg.dedup.threshold for b in bands for other in buckets.get(b, ())[:8])
            if dup:
                dups += 1
                continue
            kept += 1
            buckets["x" + xh].append(s)
            for b in bands:
                buckets[b].append(s)
        batch.clear()

    for chunk in plan_chunks(path, "sft", 0):
        for row in read_chunk(chunk):
            source += 1
            batch.append(row)
            if len(batch) == cfg.batch_size:
                flush()
    if batch:
        flush()
    wall = time.monotonic() - t0
    return {"mode": "single-process loop", "source_records": source, "emitted": kept, "duplicates": dups,
            "wall_s": round(wall, 2), "records_per_s": round(source / wall, 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def ray_run(path: Path, cpus: int, work: Path) -> dict:
    import ray

    from medgpt_ray.config import CleanConfig
    from medgpt_ray.data.clean import clean_corpus

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    try:
        with PeakRSS() as rss:
            report = clean_corpus([str(path)], work / f"out_{cpus}cpu", "sft", CleanConfig(), echo=print)
    finally:
        ray.shutdown()
    return {"mode": f"ray data, {cpus} CPU", "cpus": cpus, "source_records": report["source_records"],
            "emitted": report["emitted"], "quarantined": report["quarantined"], "adds_up": report["adds_up"],
            "duplicate_clusters": report["duplicate_clusters"], "redactions": report["redactions"],
            "wall_s": report["wall_s"], "records_per_s": report["source_records_per_s"],
            "records_per_s_per_cpu": round(report["source_records_per_s"] / cpus, 1),
            "peak_rss_mib": {"driver": round(rss.driver / 2**20, 1), "largest_worker": round(rss.worker / 2**20, 1),
                             "all_processes": round(rss.total / 2**20, 1)}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--cpus", type=int, nargs="+", default=[1, 2])
    p.add_argument("--baseline", action="store_true", help="also time the single-process loop")
    p.add_argument("--work", default="/tmp/medgpt-clean-bench")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    work = Path(args.work)
    path = corpus(args.records, work)
    results = {"command": "python " + " ".join(sys.argv), "records": args.records,
               "corpus_bytes": path.stat().st_size,
               "machine": {"cpus": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
                           "python": platform.python_version()},
               "runs": []}
    if args.baseline:
        results["runs"].append(baseline(path))
        print(json.dumps(results["runs"][-1]), flush=True)
    for cpus in args.cpus:
        results["runs"].append(ray_run(path, cpus, work))
        print(json.dumps(results["runs"][-1]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
