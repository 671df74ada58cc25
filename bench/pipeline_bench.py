"""What the benchmarks that run a whole pipeline on the real-length corpus share (bench/eval_stage_run.py,
bench/rl_stage_run.py): their common arguments and a from-scratch pipeline run whose failure is a result.
real_length_throughput.py has the corpus, the capped stage module and the Ray start-up they use."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import real_length_throughput as rlt


def add_pipeline_run_args(ap: argparse.ArgumentParser, workdir: str) -> None:
    """The arguments of a benchmark that runs the pipeline on the real-length corpus (bench/eval_stage_run.py,
    bench/rl_stage_run.py): the model, config, card, overrides, corpus and directories."""
    ap.add_argument("--model", default="tiny",
                    choices=["tiny", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen3.5-0.8b"])
    ap.add_argument("--config", help="pipeline YAML (default: configs/tiny-cpu.yaml for tiny, else "
                                     "configs/qwen2.5-7b-4x4090.yaml)")
    ap.add_argument("--gpu-mem-gib", type=float, default=24.0)
    ap.add_argument("--gpu-type", default="detected")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--sft-records", type=int, default=4000)
    ap.add_argument("--pref-records", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=workdir)
    ap.add_argument("--out", required=True)
    ap.add_argument("--verbose", action="store_true")


def pipeline_run_defaults(a: argparse.Namespace) -> argparse.Namespace:
    a.config = a.config or str(rlt.CONFIGS["tiny" if a.model == "tiny" else "gpu"])
    a.effective_batch = None  # each stage's own, from the config
    return a


def run_fresh_pipeline(cfg: Any, doc: dict[str, Any]) -> Path:
    """Run the benchmark pipeline of `cfg` from scratch (its run directory removed first: never a resumed or skipped
    stage), `doc` told the status (a failure or `timeout`'s SIGTERM is a result: what finished is still measured);
    returns the run directory."""
    from medgpt_ray.run.pipeline import RunOptions

    pipeline = rlt.bench_pipeline()(cfg, RunOptions(), "local")
    shutil.rmtree(pipeline.run_dir, ignore_errors=True)
    try:
        pipeline.run()
        doc["status"] = "ok"
    except BaseException as e:  # noqa: BLE001  (also Ray's exit on SIGTERM)
        doc.update(status="failed", error=f"{type(e).__name__}: {e}"[-3000:])
    return Path(pipeline.run_dir)
