"""Cleaning throughput: records/s of the Ray Data pipeline on n CPUs against a single-process loop running the
same operators, per core, with the scaling efficiency from 1 core, peak memory, and whether Ray's memory monitor
killed anything.

    python bench/clean_throughput.py --records 100000 --cpus 1 2 --baseline --out bench/results/clean_100k.json
    python bench/clean_throughput.py --records 1000000 --cpus 1 4 8 16 --baseline --out clean_scaling_1m.json
    python bench/clean_throughput.py --records 100000 --cpus 16 --parallel-baseline 16 --out loops.json

Every configuration runs in its own child process pinned with `taskset -c 0-(n-1)` (the raylet and the Ray workers
inherit the affinity, so "n CPUs" means n cores), with its own fresh Ray temp dir, an explicit object store size
and ray.init(num_cpus=n). The baseline runs the same way on core 0. The results JSON is rewritten after every
configuration, so a timeout keeps what finished. The corpus comes from bench/make_dirty_corpus.py (generated
once into --work and reused).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_support import PeakRSS, corpus, timeline_summary  # noqa: E402  (bench/ is the script's own folder)


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
        for keys, sig in zip(feats["dedup_keys"].to_pylist(), feats["minhash"].to_pylist(), strict=True):
            s = np.frombuffer(sig, dtype=np.uint64)
            xh, bands = keys[0], keys[1:]  # the exact key, then one per LSH band (ops.dedup.dedup_features)
            dup = bool(buckets.get(xh)) or any(
                float(np.mean(s == other)) >= cfg.dedup.threshold for b in bands for other in buckets.get(b, ())[:8])
            if dup:
                dups += 1
                continue
            kept += 1
            buckets[xh].append(s)
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


def ray_run(path: Path, cpus: int, work: Path, object_store_gib: float, temp_dir: str, sets: list[str],
            second_pass: bool = False) -> dict:
    import ray

    from medgpt_ray.config import load_clean_config
    from medgpt_ray.data.clean import clean_corpus
    from medgpt_ray.run.progress import LiveProgress

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    lines: list[str] = []

    def echo(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    ray.init(address="local", num_cpus=cpus, object_store_memory=int(object_store_gib * 2**30), _temp_dir=temp_dir,
             include_dashboard=False, log_to_driver=False)
    try:
        start = time.time()
        with PeakRSS() as rss:
            report = clean_corpus([str(path)], work / f"out_{cpus}cpu", "sft", load_clean_config(None, sets), echo=echo,
                                  live_progress=LiveProgress,  # as `medgpt-ray clean` runs it
                                  overwrite=True)  # the bench owns --work
            time.sleep(0.6)  # one more sample of every process's CPU time before the cluster goes
        cpu = rss.cpu_seconds()
        events = ray.timeline()
        Path(temp_dir, "timeline.json").write_text(json.dumps(events), encoding="utf-8")  # chrome://tracing
        timeline = timeline_summary(events, start, cpus)
        warm = warm_pass(path, work, cpus, sets, temp_dir) if second_pass else None
    finally:
        ray.shutdown()
    stages = report.get("timings_s")  # read+clean, the dedup decision's parts, apply+write
    return {"mode": f"ray data, {cpus} CPU", "cpus": cpus, "affinity": sorted(os.sched_getaffinity(0)),
            "source_records": report["source_records"],
            "emitted": report["emitted"], "quarantined": report["quarantined"], "adds_up": report["adds_up"],
            "duplicate_clusters": report["duplicate_clusters"], "redactions": report["redactions"],
            "wall_s": report["wall_s"], "stages": stages, "records_per_s": report["source_records_per_s"],
            "records_per_s_per_cpu": round(report["source_records_per_s"] / cpus, 1),
            "peak_rss_mib": {"driver": round(rss.driver / 2**20, 1), "largest_worker": round(rss.worker / 2**20, 1),
                             "all_processes": round(rss.total / 2**20, 1)},
            "cpu_s": cpu, "cpu_detail": rss.cpu_detail(), "ray_timeline": timeline,
            **({"warm_pass": warm} if warm else {})}


def warm_pass(path: Path, work: Path, cpus: int, sets: list[str], temp_dir: str) -> dict:
    """The same cleaning again on the same cluster: its worker processes have imported everything, jieba's
    dictionary is loaded and Ray Data's coordinator actor is up. The first pass minus this one is what a job pays
    once for starting; this one is the rate a long corpus runs at."""
    import ray

    from medgpt_ray.config import load_clean_config
    from medgpt_ray.data.clean import clean_corpus

    start = time.time()
    report = clean_corpus([str(path)], work / f"out_{cpus}cpu", "sft", load_clean_config(None, sets),
                          echo=lambda line: None, overwrite=True)
    events = [e for e in ray.timeline() if e.get("ts", 0) / 1e6 >= start]  # this pass's events only
    Path(temp_dir, "timeline_warm.json").write_text(json.dumps(events), encoding="utf-8")
    return {"wall_s": report["wall_s"], "records_per_s": report["source_records_per_s"],
            "stages": report.get("timings_s"), "ray_timeline": timeline_summary(events, start, cpus)}


# What Ray 2.60 logs when its memory monitor kills workers, and when objects were lost (a killed worker's outputs).
MEMORY_KILL = re.compile(r"killed due to (the node running low on )?memory|Selected \d+ workers? to kill|"
                         r"memory usage above threshold|exceeded threshold|OutOfMemoryError|lost objects|"
                         r"ObjectLostError", re.IGNORECASE)
# The raylet computes its kill threshold once, from the memory the machine reports when Ray starts.
MONITOR_START = re.compile(r"MemoryMonitor initialized with usage threshold at (\d+) bytes.*total system memory "
                           r"bytes: (\d+)")


def memory_events(temp_dir: str, child_output: str) -> dict:
    """From this configuration's own Ray temp dir (raylet/GCS logs) and the child's output: the memory total
    and kill threshold the raylet started with, the object store size, and every line saying the memory
    monitor killed a worker or objects were lost, so a repeat of the 16-core failure is diagnosable from the
    results JSON alone."""
    hits: list[str] = []
    info: dict = {}
    logs = sorted(Path(temp_dir).glob("session_*/logs/raylet*")) + sorted(Path(temp_dir).glob("session_*/logs/gcs*"))
    for f in logs:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if m := MONITOR_START.search(line):
                info = {"kill_threshold_gib": round(int(m.group(1)) / 2**30, 2),
                        "system_memory_at_start_gib": round(int(m.group(2)) / 2**30, 2)}
            elif MEMORY_KILL.search(line):
                hits.append(f"{f.name}: {line.strip()[:300]}")
    hits += [f"child: {line.strip()[:300]}" for line in child_output.splitlines() if MEMORY_KILL.search(line)]
    return {"monitor_at_start": info,
            "killed_by_memory_monitor": any(re.search(r"kill", h, re.I) for h in hits),
            "lost_objects": any("lost object" in h.lower() for h in hits), "lines": hits[:20]}


def default_object_store_gib(corpus_bytes: int) -> float:
    """Sized from the corpus, not from the memory the machine reports at start (which on the lent GPU
    machines starts small and grows): stage 1's blocks stream to Parquet, what the object store holds at once
    is the dedup shuffle (~17 small (key, id) rows per record), the candidate pairs and the signatures of
    near candidates: a few times the corpus covers it, with 2 GiB as the floor."""
    return float(max(2, math.ceil(3 * corpus_bytes / 2**30)))


def child(args: argparse.Namespace) -> None:
    """One configuration, in this (pinned) process: writes its result to --result-file."""
    path = Path(args.corpus)
    if args.child == "baseline":
        result = baseline(path)
        result["affinity"] = sorted(os.sched_getaffinity(0))
    else:
        result = ray_run(path, args.child_cpus, Path(args.work), args.object_store_gib, args.temp_dir, args.sets,
                         args.warm_pass)
    Path(args.result_file).write_text(json.dumps(result), encoding="utf-8")


def run_configuration(kind: str, cpus: int, args: argparse.Namespace, path: Path, object_store_gib: float,
                      cores: str | None = None) -> dict:
    """Run one configuration in a child pinned to cores 0..cpus-1 (or `cores`) with taskset, with a deadline.
    SIGINT on timeout: a SIGTERM'd driver leaves ray:: workers behind."""
    stamp = time.strftime("%H%M%S")
    cores = cores or f"0-{cpus - 1}"
    temp_dir = f"/tmp/mcb/{kind[0]}{cpus}-{cores}-{stamp}-{os.getpid()}"  # short: Ray's sockets live under it
    Path(temp_dir).mkdir(parents=True, exist_ok=True)
    result_file = Path(temp_dir) / "result.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--child-cpus", str(cpus),
           "--corpus", str(path), "--work", args.work, "--object-store-gib", str(object_store_gib),
           "--temp-dir", temp_dir, "--result-file", str(result_file), "--out", "-",
           *(f"--set={x}" for x in args.sets), *(["--warm-pass"] if args.warm_pass else [])]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", cores, *cmd]
    if args.profile and kind == "ray":
        # py-spy outside the pinned cores, sampling the driver and every Ray worker it starts, without
        # pausing them; raw (collapsed stack) lines, one file per configuration.
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        cmd = ["py-spy", "record", "--subprocesses", "--nonblocking", "--rate", "47", "--format", "raw",
               "--output", str(Path(args.profile) / f"{kind}{cpus}.txt"), "--", *cmd]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if kind == "ray" and args.no_memory_monitor:
        env["RAY_memory_monitor_refresh_ms"] = "0"  # its kill threshold is fixed from the memory seen at start
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    out_lines: list[str] = []
    reader = threading.Thread(target=lambda: [out_lines.append(line) for line in proc.stdout], daemon=True)
    reader.start()
    status = "ok"
    try:
        proc.wait(timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        status = "timeout"
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=10)
    output = "".join(out_lines)
    if status == "ok" and proc.returncode != 0:
        status = f"failed (rc {proc.returncode})"
    result = json.loads(result_file.read_text()) if result_file.is_file() else {"mode": kind, "cpus": cpus}
    result.update({"status": status, "elapsed_s": round(time.monotonic() - t0, 1), "command": " ".join(cmd),
                   "ray_temp_dir": temp_dir})
    if kind == "ray":
        result["object_store_gib"] = object_store_gib
        result["memory"] = memory_events(temp_dir, output)
    if status != "ok":
        result["output_tail"] = output[-3000:]
    return result


def parallel_baselines(n: int, args: argparse.Namespace, path: Path) -> dict:
    """n single-process loops at once, each pinned to its own core, each over the whole corpus: the per-core
    rate the machine itself gives when n cores are busy (clock, caches, memory bandwidth), the ceiling for
    any n-core run of the same operators."""
    runs: list[dict] = [{} for _ in range(n)]

    def one(i: int) -> None:
        runs[i] = run_configuration("baseline", 1, args, path, 0.0, cores=str(i))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in runs if r.get("status") == "ok"]
    rates = [r["records_per_s"] for r in ok]
    return {"mode": f"{n} single-process loops at once", "cpus": n, "status": "ok" if len(ok) == n else "failed",
            "records_per_s_per_cpu": round(sum(rates) / len(rates), 1) if rates else None,
            "slowest_per_cpu": min(rates, default=None), "fastest_per_cpu": max(rates, default=None),
            "runs": [{k: r.get(k) for k in ("status", "records_per_s", "wall_s", "affinity")} for r in runs]}


def summarize(results: dict) -> None:
    """Per-core rate, scaling efficiency against 1 core and the ratio to the single-process loop."""
    base = next((r for r in results["runs"] if r.get("mode") == "single-process loop" and r.get("status") == "ok"),
                None)
    one = next((r for r in results["runs"] if r.get("cpus") == 1 and "ray" in r.get("mode", "")
                and r.get("status") == "ok"), None)
    for r in results["runs"]:
        if "loops at once" in r.get("mode", "") and base and r.get("records_per_s_per_cpu"):
            r["per_core_vs_baseline"] = round(r["records_per_s_per_cpu"] / base["records_per_s"], 3)
        if "ray" not in r.get("mode", "") or r.get("status") != "ok":
            continue
        per_core = r["records_per_s"] / r["cpus"]
        r["records_per_s_per_cpu"] = round(per_core, 1)
        if one:
            r["scaling_efficiency_vs_1cpu"] = round(per_core / one["records_per_s"], 3)
        if base:
            r["per_core_vs_baseline"] = round(per_core / base["records_per_s"], 3)
        if (warm := r.get("warm_pass")) and warm.get("records_per_s"):
            warm_per_core = warm["records_per_s"] / r["cpus"]
            one_warm = (one or {}).get("warm_pass", {}).get("records_per_s")
            if one_warm:
                warm["scaling_efficiency_vs_1cpu"] = round(warm_per_core / one_warm, 3)
            if one:  # against what a 1-core job really pays: the cold pass
                warm["scaling_vs_cold_1cpu"] = round(warm_per_core / one["records_per_s"], 3)
            if base:
                warm["per_core_vs_baseline"] = round(warm_per_core / base["records_per_s"], 3)


def one_line(r: dict) -> str:
    if r.get("status") != "ok":
        return f"[bench] {r.get('mode')}: {r.get('status')} after {r.get('elapsed_s')}s"
    if r.get("mode") == "single-process loop":
        return f"[bench] baseline (1 core): {r['records_per_s']:,.0f} records/s, {r['wall_s']}s"
    if "loops at once" in r.get("mode", ""):
        return (f"[bench] {r['mode']}: {r['records_per_s_per_cpu']:,.0f} records/s per core "
                f"({r.get('per_core_vs_baseline')}x one loop alone)")
    extra = [f"{r['records_per_s_per_cpu']:,.0f}/s per core"]
    if "scaling_efficiency_vs_1cpu" in r:
        extra.append(f"scaling {r['scaling_efficiency_vs_1cpu']:.2f} of linear")
    if "per_core_vs_baseline" in r:
        extra.append(f"{r['per_core_vs_baseline']:.2f}x baseline per core")
    if warm := r.get("warm_pass"):
        extra.append(f"warm pass {warm['records_per_s']:,.0f} records/s in {warm['wall_s']}s"
                     f" (scaling {warm.get('scaling_efficiency_vs_1cpu')},"
                     f" {warm.get('per_core_vs_baseline')}x baseline)")
    if r.get("memory", {}).get("lines"):
        extra.append("MEMORY EVENTS: " + "; ".join(r["memory"]["lines"][:2]))
    return (f"[bench] ray {r['cpus']} CPU: {r['records_per_s']:,.0f} records/s in {r['wall_s']}s "
            f"(stages {r.get('stages')}), " + ", ".join(extra))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--cpus", type=int, nargs="+", default=[1, 2], help="Ray configurations (cores each)")
    p.add_argument("--baseline", action="store_true", help="also time the single-process loop (on one core)")
    p.add_argument("--parallel-baseline", type=int, nargs="*", default=[], metavar="N",
                   help="also run N loops at once, one per core (the machine's own per-core rate under load)")
    p.add_argument("--work", default="/tmp/medgpt-clean-bench")
    p.add_argument("--out", required=True)
    p.add_argument("--object-store-gib", type=float, default=None,
                   help="Ray object store size; default from the corpus size (not from the memory at start)")
    p.add_argument("--timeout-s", type=float, default=3600, help="per configuration")
    p.add_argument("--no-memory-monitor", action="store_true",
                   help="start Ray with its memory monitor off (RAY_memory_monitor_refresh_ms=0): its kill threshold "
                        "is fixed from the memory the machine reports at start")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="cleaning option for the Ray runs, e.g. --set num_cpus_per_task=1")
    p.add_argument("--profile", metavar="DIR", help="record every Ray configuration with py-spy into DIR")
    p.add_argument("--warm-pass", action="store_true",
                   help="clean the corpus a second time on each Ray configuration's cluster (warm workers)")
    # internal: one configuration in a pinned child process
    p.add_argument("--child", choices=["baseline", "ray"], help=argparse.SUPPRESS)
    p.add_argument("--child-cpus", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--corpus", help=argparse.SUPPRESS)
    p.add_argument("--temp-dir", help=argparse.SUPPRESS)
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    work = Path(args.work)
    path = corpus(args.records, work)
    size = path.stat().st_size
    store = args.object_store_gib or default_object_store_gib(size)
    results = {"command": "python " + " ".join(sys.argv), "records": args.records, "corpus_bytes": size,
               "object_store_gib": store, "clean_sets": args.sets, "memory_monitor": not args.no_memory_monitor,
               "ray_env": {k: v for k, v in os.environ.items() if k.startswith(("RAY_", "RAY_DATA"))},
               "machine": {"cpus": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
                           "python": platform.python_version()},
               "runs": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    configs = (([("baseline", 1)] if args.baseline else []) + [("parallel", n) for n in args.parallel_baseline]
               + [("ray", n) for n in args.cpus])
    for kind, cpus in configs:
        if cpus > (os.cpu_count() or 1):
            results["runs"].append({"mode": kind, "cpus": cpus, "status": f"skipped: only {os.cpu_count()} cores"})
        elif kind == "parallel":
            results["runs"].append(parallel_baselines(cpus, args, path))
        else:
            results["runs"].append(run_configuration(kind, cpus, args, path, store))
        summarize(results)
        out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(one_line(results["runs"][-1]), flush=True)


if __name__ == "__main__":
    main()
