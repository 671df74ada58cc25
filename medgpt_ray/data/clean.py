"""The corpus-cleaning pipeline on Ray: read -> canonical -> normalize/sign-offs/PII/quality -> dedup -> write.

Only wiring lives here (the one module of data/ that imports Ray); every step is a pure function of data/ops,
data/clean_inputs (the chunks read), data/clean_stage1 (the stage-1 files), data/dedup_marks and
data/clean_output, tested without Ray.

    1. read + convert + clean   Ray Data, streaming over byte-range chunks of the inputs, map and Parquet write
                                fused; one file per chunk under _work/stage1, each with its records' dedup keys
                                (exact hash and MinHash-LSH bands, as 64-bit numbers) and signatures
    2. dedup decisions          a shuffle of small (key, rid) rows, never of the records, as Ray tasks over the
                                stage-1 files: each file's rows are split by key into one part per CPU, each
                                part's key groups give (later, earlier) candidate pairs; near pairs are
                                confirmed on their MinHash signatures (fetched for candidate records only)
    3. apply + count + write    one Ray task per stage-1 file: marks applied, report counts taken, and each
                                source chunk's rows (a contiguous range of stable ids (file, line, index), so
                                no global sort) written in id order, per kind to DIR/data/<kind>/part-<first
                                id>.parquet; everything dropped to DIR/quarantine/part-<first id>.jsonl (0600)
                                with file, line, operator, reason

Steps 2 and 3 are plain Ray tasks, not Ray Data: Ray 2.60's Data shuffles (hash or sort) cost a fixed ~4 s on 2
cores and ~10 s on 16 whatever the data size, and read_parquet samples every file before each pass; a task per
file and one per key part cost milliseconds to schedule and scale the same way across nodes (the output
directory, like the stage-1 files, must be visible to every node).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray

from medgpt_ray.config import CleanConfig
from medgpt_ray.data.chunks import SourceChunk
from medgpt_ray.data.clean_inputs import chunk_bytes, plan_inputs
from medgpt_ray.data.clean_output import build_report, chunk_start_ids, format_report, merge_overlapping_parts
from medgpt_ray.data.clean_stage1 import (
    finish_file,
    keys_by_part,
    pairs_of_part,
    signatures_in,
    stage1_rows,
)
from medgpt_ray.data.dedup_marks import PAIR_SCHEMA, decide_marks, near_candidates
from medgpt_ray.data.output_dir import MARKER, OWN_SUBDIRS, claim_output_dir
from medgpt_ray.data.private import private_dir
from medgpt_ray.metrics import record_clean_report

# The key shuffle makes files x parts objects: one part per CPU, but not 10^5 objects on a big cluster.
MAX_KEY_PARTS = 64


# ---- stage 1: read + convert + clean, streaming in Ray Data (stage1_rows does the work) ------------
def stage1_chunks(items: pa.Table, cfg: CleanConfig, progress: tuple[str, str] | None = None
                  ) -> Iterator[pa.Table]:
    """Read whole chunks and clean them batch by batch in the same task: rows never round-trip through
    Ray as Python dicts, and each yielded table is one output block (streaming, bounded memory).
    `progress` names the driver's progress actor (name, namespace): each batch reports its row count."""
    from medgpt_ray.data.chunks import read_chunk

    os.umask(0o077)  # what this worker writes (the fused Parquet write of these rows) is owner-only
    actor = ray.get_actor(progress[0], namespace=progress[1]) if progress else None
    for item in items.to_pylist():
        rows: list[dict[str, Any]] = []
        for row in read_chunk(SourceChunk(**item)):
            rows.append(row)
            if len(rows) == cfg.batch_size:
                if actor is not None:
                    actor.push.remote({"rows": len(rows)})
                yield stage1_rows(rows, cfg)
                rows = []
        if actor is not None:
            actor.push.remote({"rows": len(rows), "chunk_done": 1, "bytes": chunk_bytes(SourceChunk(**item))})
        if rows:
            yield stage1_rows(rows, cfg)


def _warm_worker() -> None:
    """What every cleaning task's worker needs before its first chunk: Ray Data's task module (it pulls in
    pandas), the operators and jieba's dictionary (~3 CPU-s in all, bench/results/clean_scaling_*.json)."""
    import ray.data._internal.execution.operators.map_operator  # noqa: F401

    from medgpt_ray.data.ops import dedup, quality, record, text_measures  # noqa: F401

    text_measures.load_tokenizer()


def warm_workers(cpus: int, remote: dict[str, Any]) -> list[ray.ObjectRef]:
    """Start one warm-up task per cleaning slot now, while the driver plans the chunks: the worker processes
    boot and import in parallel with it, and Ray hands the warmed (idle) workers to the cleaning tasks."""
    slots = max(1, int(cpus / remote.get("num_cpus", 1.0)))
    task = ray.remote(_warm_worker).options(scheduling_strategy="SPREAD", **remote)
    return [task.remote() for _ in range(slots)]


# ---- stages 2 and 3: Ray tasks over the stage-1 files ----------------------------------------------
def find_candidate_pairs(files: list[str], parts: int, remote: dict[str, Any]) -> pa.Table:
    """The key shuffle: one map task per stage-1 file splits its (key, rid) rows into `parts`, one reduce task
    per part pairs them. Only refs pass through the driver; the pairs (a few per duplicate) come back."""
    split = ray.remote(keys_by_part).options(num_returns=parts, **remote)
    maps = [split.remote(f, parts) for f in files]
    pair = ray.remote(pairs_of_part).options(**remote)
    refs = [pair.remote(*(m[p] for m in maps)) for p in range(parts)]
    del maps  # the reducers hold what they need
    return pa.concat_tables([PAIR_SCHEMA.empty_table(), *ray.get(refs)])


def fetch_signatures(files: list[str], wanted: pa.Array, remote: dict[str, Any]) -> pa.Table:
    empty = pa.table({"rid": pa.array([], pa.int64()), "minhash": pa.array([], pa.binary())})
    if not len(wanted):
        return empty
    wanted_ref = ray.put(wanted)
    task = ray.remote(signatures_in).options(**remote)
    return pa.concat_tables([empty, *ray.get([task.remote(f, wanted_ref) for f in files])],
                            promote_options="permissive")


def write_outputs(files: list[str], marks: pa.Table, chunks: list[SourceChunk], out: Path,
                  remote: dict[str, Any]) -> tuple[Counter[str], list[list[Any]]]:
    marks_ref = ray.put(marks)
    task = ray.remote(finish_file).options(**remote)
    counts: Counter[str] = Counter()
    parts: list[list[Any]] = []
    for c, written in ray.get([task.remote(f, marks_ref, chunk_start_ids(chunks), str(out)) for f in files]):
        counts.update(c)
        parts += written
    return counts, parts


# ---- driver --------------------------------------------------------------------------------------
class Silent:
    """No live progress: the cleaning tasks push nothing (a caller that prints its own, or a test)."""

    address = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> Silent:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


def clean_corpus(inputs: list[str], out_dir: str | Path, kind: str, cfg: CleanConfig,
                 echo: Callable[[str], None] = print, live_progress: Callable[..., Any] = Silent,
                 overwrite: bool = False) -> dict[str, Any]:
    """Clean `inputs` into `out_dir` (output_dir.claim_output_dir's rules: a directory that is not ours is
    refused unless `overwrite`). `live_progress(chunks, t0, echo, files=, total_bytes=)` makes the progress
    line's context manager; its `address` names the actor the cleaning tasks push their counts to
    (run.progress.LiveProgress). A failed or interrupted run leaves no _work/, data/ or quarantine/ behind, nor the
    report.json of an earlier run into the same directory."""
    t0 = time.monotonic()
    ours = (Path(out_dir) / MARKER).is_file()  # before claim_output_dir marks it
    out = claim_output_dir(out_dir, inputs, overwrite)
    remote = {"num_cpus": cfg.num_cpus_per_task}
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    warm = warm_workers(cpus, remote)
    chunks = plan_inputs(inputs, kind, echo, cpus, cfg.chunks_per_cpu)  # bad inputs fail before anything goes
    for sub in OWN_SUBDIRS:
        shutil.rmtree(out / sub, ignore_errors=True)
    if ours:  # the last run's report describes the data/ just removed; a foreign directory's files are not ours
        (out / "report.json").unlink(missing_ok=True)
    try:
        return _clean_chunks(chunks, out, cfg, t0, echo, live_progress, remote, cpus, warm)
    except BaseException:  # failed or interrupted (Ctrl-C): part of data/ must not pass for a cleaned corpus
        for sub in OWN_SUBDIRS:
            shutil.rmtree(out / sub, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(out / "_work", ignore_errors=True)


def _write_stage1(chunks: list[SourceChunk], work: Path, n_files: int, cfg: CleanConfig, t0: float,
                  echo: Callable[[str], None], live_progress: Callable[..., Any], remote: dict[str, Any]) -> None:
    """Step 1: every chunk read, converted and cleaned in Ray Data, streaming into the stage-1 files under
    `work`/stage1, with the live progress line while it runs."""
    echo(f"[clean] 1/3 reading and cleaning {n_files} file(s) in {len(chunks)} chunk(s)")
    ds = ray.data.from_items([asdict(c) for c in chunks], override_num_blocks=max(1, len(chunks)))
    progress = live_progress(len(chunks), t0, echo, files=n_files, total_bytes=sum(map(chunk_bytes, chunks)))
    stage1 = ds.map_batches(stage1_chunks, fn_kwargs={"cfg": cfg, "progress": progress.address},
                            batch_format="pyarrow", batch_size=1, **remote)
    with progress:
        # The same resources as the map, so Ray Data fuses map and write into one task (no block hand-over).
        stage1.write_parquet(str(work / "stage1"), ray_remote_args=remote)


def _clean_chunks(chunks: list[SourceChunk], out: Path, cfg: CleanConfig, t0: float, echo: Callable[[str], None],
                  live_progress: Callable[..., Any], remote: dict[str, Any], cpus: int,
                  warm: list[ray.ObjectRef]) -> dict[str, Any]:
    work = private_dir(out / "_work")  # stage-1 files hold record text
    files = sorted({c.path for c in chunks})
    _write_stage1(chunks, work, len(files), cfg, t0, echo, live_progress, remote)
    ray.get(warm)  # long done; a worker that could not import the operators fails the run here, not silently
    t1 = time.monotonic()

    if not any((work / "stage1").glob("*.parquet")):
        # Inputs with no rows at all (empty files): nothing to dedup or write, but still a report.
        (out / "quarantine").mkdir(mode=0o700)
        shutil.rmtree(work, ignore_errors=True)
        report = build_report(Counter(), [], {"exact": 0, "near": 0}, files, time.monotonic() - t0)
        (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")
        echo(format_report(report, out))
        return report

    echo(f"[clean] 2/3 finding duplicates (exact={cfg.dedup.exact}, near={cfg.dedup.near}) "
         f"[{t1 - t0:.1f}s so far]")
    stage1_files = sorted(str(f) for f in (work / "stage1").glob("*.parquet"))
    # At least 2 parts: with num_returns=1 Ray would hand back the list itself, not one ref per part.
    pairs = find_candidate_pairs(stage1_files, max(2, min(cpus, MAX_KEY_PARTS)), remote)
    t_pairs = time.monotonic()
    # Only the signatures of records in a near-duplicate candidate pair come to the driver.
    sigs = fetch_signatures(stage1_files, near_candidates(pairs), remote)
    t_sigs = time.monotonic()
    marks = decide_marks(pairs, sigs, cfg.dedup.threshold)
    clusters = {how: pc.count_distinct(marks.filter(pc.equal(marks["how"], how))["dup_of"]).as_py()
                for how in ("exact", "near")}
    t2 = time.monotonic()

    echo(f"[clean] 3/3 writing: {marks.num_rows} duplicates in {sum(clusters.values())} clusters "
         f"[{t2 - t0:.1f}s so far]")
    (out / "quarantine").mkdir(mode=0o700)
    counts, parts = write_outputs(stage1_files, marks, chunks, out, remote)
    if merged := merge_overlapping_parts(parts):
        echo(f"[clean] merged {merged} group(s) of overlapping part files")
    kinds = sorted({k.split(":")[1] for k in counts if k.startswith("kind:")})
    shutil.rmtree(work)
    wall = time.monotonic() - t0
    report = build_report(counts, kinds, clusters, files, wall)
    # Where the time went (seconds), to tell a slow operator from a slow shuffle on a new machine.
    report["timings_s"] = {"read_clean": round(t1 - t0, 2), "dedup_shuffle_pairs": round(t_pairs - t1, 2),
                           "dedup_signatures": round(t_sigs - t_pairs, 2), "dedup_decide": round(t2 - t_sigs, 2),
                           "apply_write": round(time.monotonic() - t2, 2)}
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")
    record_clean_report(out.parent.name if out.name == "clean" else out.name, report)
    echo(format_report(report, out))
    return report
