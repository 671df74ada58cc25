"""Measure the peak GPU memory of real stage runs and compare it with the estimator.

Each configuration runs the real stage code (medgpt_ray.stages.<stage>.build,
then trainer.train() for a few optimizer steps) in its own process, on a model
directory with random weights of a real shape (Qwen2.5-0.5B/1.5B/7B) and
synthetic records long enough that every sample is exactly seq_len tokens.
Measured: torch.cuda.max_memory_allocated / max_memory_reserved over the run,
the weights on the GPU before training, and tokens/s after the first step.

    # on the GPU machine (wheels: bash ../shared/gpu/make-wheelhouse.sh --no-ray --bnb .whl-bnb)
    python bench/memory_calibration.py --workdir /tmp/calib --out $OUT/memory_calibration.json
    # here: recompute the predictions of a committed result with the current estimator
    python bench/memory_calibration.py --repredict bench/results/memory_calibration_h200.json

Error is judged as in FIELD-NOTES: |predicted - measured| relative to the
measured peak, and small peaks by max(relative, 0.5 GiB absolute).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.family_models import prepare_model  # noqa: E402

GIB = 2**30
CAP_24_GIB = 24.0


def run_cfg(model: str, stage: str, method: str, precision: str, mb: int, seq: int, ckpt: float,
            fused: bool = False, zero: int = 0, offload: str = "none", rank: int = 8, optim: str = "adamw",
            tag: str = "", kernels: bool = False, compiled: bool = False) -> dict[str, Any]:
    return {"model": model, "stage": stage, "method": method, "precision": precision, "micro_batch": mb,
            "seq_len": seq, "ckpt_fraction": ckpt, "fused_ce": fused or stage in ("sft", "dpo"), "zero": zero,
            "offload": offload, "lora_rank": rank, "optim": optim, "tag": tag, "fused_kernels": kernels,
            "compile": compiled}


def matrix() -> list[dict[str, Any]]:
    q05, q15, q7 = "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"
    return [
        # 0.5B: the 152k vocabulary dominates; full training in fp32 master weights
        run_cfg(q05, "pt", "full", "amp-bf16", 4, 1024, 0),
        run_cfg(q05, "pt", "full", "amp-bf16", 4, 1024, 0, fused=True),
        run_cfg(q05, "pt", "full", "amp-bf16", 4, 1024, 1),
        run_cfg(q05, "pt", "full", "amp-bf16", 8, 1024, 0.5, fused=True),
        run_cfg(q05, "pt", "full", "bf16", 4, 1024, 0),
        run_cfg(q05, "pt", "full", "amp-bf16", 4, 1024, 0, fused=True, optim="adamw-8bit"),
        run_cfg(q05, "pt", "lora", "bf16", 4, 1024, 0),
        run_cfg(q05, "pt", "lora", "bf16", 8, 2048, 1, fused=True),
        run_cfg(q05, "sft", "full", "amp-bf16", 4, 1024, 0),
        run_cfg(q05, "sft", "full", "amp-bf16", 8, 1024, 1),
        run_cfg(q05, "sft", "lora", "bf16", 8, 1024, 0, rank=16),
        run_cfg(q05, "sft", "lora", "bf16", 4, 2048, 0.5, rank=16),
        run_cfg(q05, "rm", "full", "amp-bf16", 4, 1024, 0),
        run_cfg(q05, "rm", "lora", "bf16", 8, 1024, 0),
        run_cfg(q05, "dpo", "lora", "bf16", 4, 1024, 0),
        run_cfg(q05, "dpo", "lora", "bf16", 4, 1024, 1),
        run_cfg(q05, "dpo", "full", "amp-bf16", 2, 1024, 0),
        run_cfg(q05, "sft", "full", "amp-bf16", 4, 1024, 0, zero=2),
        run_cfg(q05, "sft", "full", "amp-bf16", 4, 1024, 0, zero=2, offload="optimizer"),
        run_cfg(q05, "sft", "full", "amp-bf16", 4, 1024, 0, zero=3),
        run_cfg(q05, "sft", "full", "amp-bf16", 4, 1024, 0, zero=3, offload="all"),
        # 1.5B
        run_cfg(q15, "sft", "full", "amp-bf16", 4, 1024, 1),
        run_cfg(q15, "sft", "lora", "bf16", 8, 1024, 0),
        run_cfg(q15, "pt", "lora", "bf16", 4, 2048, 0.5),
        run_cfg(q15, "dpo", "lora", "bf16", 2, 2048, 1),
        run_cfg(q15, "rm", "lora", "bf16", 4, 2048, 0),
        run_cfg(q15, "sft", "full", "amp-bf16", 4, 2048, 1, zero=2, offload="optimizer"),
        run_cfg(q15, "sft", "qlora", "bf16", 8, 1024, 0),
        # 7B: what a 24 GB card is asked to do
        run_cfg(q7, "sft", "lora", "bf16", 1, 2048, 1, tag="field-report-shape-trl"),
        run_cfg(q7, "sft", "lora", "bf16", 4, 2048, 1),
        run_cfg(q7, "sft", "lora", "bf16", 2, 2048, 0.5),
        run_cfg(q7, "pt", "lora", "bf16", 1, 2048, 1, tag="field-report-shape-hf-loss"),
        run_cfg(q7, "pt", "lora", "bf16", 2, 2048, 1, fused=True),
        run_cfg(q7, "dpo", "lora", "bf16", 1, 1024, 1),
        run_cfg(q7, "dpo", "lora", "bf16", 2, 1024, 0.25),
        run_cfg(q7, "rm", "lora", "bf16", 2, 1024, 1),
        run_cfg(q7, "sft", "qlora", "bf16", 4, 2048, 1),
        run_cfg(q7, "dpo", "qlora", "bf16", 2, 1024, 1),
        # Liger's RMSNorm/SwiGLU/RoPE kernels (id suffix -lk)
        run_cfg(q05, "pt", "full", "amp-bf16", 4, 1024, 0, fused=True, kernels=True),
        run_cfg(q05, "sft", "lora", "bf16", 8, 1024, 0, kernels=True),
        run_cfg(q7, "sft", "lora", "bf16", 4, 2048, 0.5, kernels=True),
        run_cfg(q7, "dpo", "lora", "bf16", 4, 1024, 0.75, kernels=True),
        # Compiled decoder layers (id suffix -cc; stages/speed.py): the layer fusion comes from inductor
        run_cfg(q05, "pt", "full", "amp-bf16", 4, 1024, 0, fused=True, kernels=True, compiled=True),
        run_cfg(q05, "rm", "lora", "bf16", 8, 1024, 0, compiled=True),
        run_cfg(q05, "dpo", "lora", "bf16", 4, 1024, 1, kernels=True, compiled=True),
        run_cfg(q05, "sft", "full", "amp-bf16", 4, 1024, 0, zero=2, kernels=True, compiled=True),
        run_cfg(q15, "sft", "lora", "bf16", 8, 1024, 0, kernels=True, compiled=True),
        # Full fine-tuning with a fused CE at larger micro-batches (issue 15 item 6: over-predicted there)
        run_cfg(q05, "pt", "full", "amp-bf16", 8, 1024, 0, fused=True),
        run_cfg(q05, "pt", "full", "amp-bf16", 16, 1024, 0, fused=True),
        run_cfg(q05, "sft", "full", "amp-bf16", 8, 1024, 0),
        run_cfg(q05, "sft", "full", "amp-bf16", 16, 1024, 0),
    ]


def cfg_id(c: dict[str, Any]) -> str:
    z = f"-z{c['zero']}{'' if c['offload'] == 'none' else '-off' + c['offload']}" if c["zero"] else ""
    return (f"{c['model']}-{c['stage']}-{c['method']}{'-r' + str(c['lora_rank']) if c['method'] != 'full' else ''}"
            f"-{c['precision']}-mb{c['micro_batch']}-s{c['seq_len']}-ck{c['ckpt_fraction']}"
            f"{'-fce' if c['fused_ce'] else ''}{'-8bit' if c['optim'] == 'adamw-8bit' else ''}{z}"
            f"{'-lk' if c.get('fused_kernels') else ''}{'-cc' if c.get('compile') else ''}")


# --- preparation (GPU machine) -------------------------------------------------------------------------------


def prepare_data(dest: Path, n: int = 64) -> dict[str, Path]:
    """Records far longer than 2048 tokens, so every sample is cut to exactly seq_len."""
    rng = random.Random(0)
    paras = [json.loads(line)["text"] for line in (ROOT / "data/sample/pretrain.jsonl").open(encoding="utf-8")]

    def long_text(k: int = 40) -> str:
        return "".join(rng.choice(paras) for _ in range(k))

    dest.mkdir(parents=True, exist_ok=True)
    files = {"pretrain": dest / "pretrain.jsonl", "sft": dest / "sft.jsonl", "preference": dest / "pref.jsonl"}
    with files["pretrain"].open("w", encoding="utf-8") as fh:
        for i in range(n * 4):
            fh.write(json.dumps({"id": f"p{i}", "text": long_text()}, ensure_ascii=False) + "\n")
    with files["sft"].open("w", encoding="utf-8") as fh:
        for i in range(n):
            conv = [{"role": "user", "content": "请解释这段病历。"}, {"role": "assistant", "content": long_text()}]
            fh.write(json.dumps({"id": f"s{i}", "conversations": conv}, ensure_ascii=False) + "\n")
    with files["preference"].open("w", encoding="utf-8") as fh:
        for i in range(n):
            rec = {"id": f"r{i}", "conversations": [{"role": "user", "content": "请解释这段病历。"}],
                   "chosen": long_text(), "rejected": long_text()}
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    # Stages read prepared Parquet splits (measure_one: dest/prepared); configs name the JSONL (multi_gpu_run.py).
    from medgpt_ray.data.prepare import prepare_kind

    for kind, path in files.items():
        prepare_kind(kind, [str(path)], dest / "prepared" / kind, 0.0)
    return files


# --- one configuration (child process) -----------------------------------------------------------------------


def single_process_env() -> None:
    """The distributed environment of a one-process run: stage code (DeepSpeed, accelerate) reads it as a
    Ray Train worker's."""
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29500 + os.getpid() % 1000)}.items():
        os.environ.setdefault(k, v)


def cap_allocator(cap_gib: float) -> None:
    """Cap this process's CUDA allocator at `cap_gib` (a 24 GiB card on a larger GPU). The CUDA context, NCCL and
    cuBLAS workspaces sit outside the cap (FIELD-NOTES)."""
    import torch

    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * GIB / total))


def measure_one(c: dict[str, Any], workdir: Path, cap_gib: float, steps: int,
                after_build: Any = None) -> dict[str, Any]:
    import torch
    from transformers import TrainerCallback

    from medgpt_ray.config import DPOStageConfig, LoraConfig, StageConfig
    from medgpt_ray.memory.stage_plan import StagePlan, deepspeed_config
    from medgpt_ray.stages import build_stage
    from medgpt_ray.stages.inputs import StageInputs

    single_process_env()
    cap_allocator(cap_gib)

    accum = int(c.get("grad_accum", 1))
    cls = DPOStageConfig if c["stage"] == "dpo" else StageConfig
    cfg = cls(method=c["method"], precision=c["precision"], lora=LoraConfig(rank=c["lora_rank"], alpha=16,
              dropout=0.05), seq_len=c["seq_len"], max_steps=steps, micro_batch=c["micro_batch"],
              effective_batch=c["micro_batch"] * accum, save_steps=10**6, logging_steps=1, lr=1e-5)
    plan = StagePlan(c["stage"], c["method"], c["precision"], c["micro_batch"], accum, 1, True, c["ckpt_fraction"],
                     c["fused_ce"], c["optim"], c["zero"], c["offload"], None,
                     fused_kernels=bool(c.get("fused_kernels")), compile=bool(c.get("compile")))
    plan = replace(plan, deepspeed=deepspeed_config(plan, cfg))
    kind = {"pt": "pretrain", "sft": "sft", "rm": "preference", "dpo": "preference"}[c["stage"]]
    split = workdir / "data" / "prepared" / kind / f"{kind}.train.parquet"
    inp = StageInputs(c["stage"], cfg, plan, str(workdir / "models" / c["model"]), "chatml",
                      str(split), str(split.with_name(f"{kind}.eval.parquet")),
                      str(workdir / "runs" / cfg_id(c)), resume=False)

    step_t: list[float] = []
    step_peak: list[float] = []

    class Probe(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            step_t.append(time.perf_counter())
            step_peak.append(torch.cuda.max_memory_allocated() / GIB)

    out: dict[str, Any] = {"id": cfg_id(c), **c, "cap_gib": cap_gib}
    try:
        built = build_stage(inp, None)
        built.trainer.add_callback(Probe())
        if c.get("lora_input_casts"):  # peft's default fp32 cast of adapted inputs (stages/speed.py removes it)
            from medgpt_ray.stages.speed import Bf16LoraInputs

            built.trainer.callback_handler.remove_callback(Bf16LoraInputs)
        if after_build is not None:  # bench/step_overhead_probe.py's variants
            after_build(built, out)
        built.trainer.args.save_strategy = "no"  # a measurement: no checkpoint at the last step (disk)
        out["weights_on_gpu_gib"] = torch.cuda.memory_allocated() / GIB
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        built.trainer.train()
        torch.cuda.synchronize()
        out["status"] = "ok"
        out["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
        out["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
        out["step_peaks_gib"] = [round(x, 3) for x in step_peak]
        tokens_per_step = accum * c["micro_batch"] * c["seq_len"] * (2 if c["stage"] in ("rm", "dpo") else 1)
        if len(step_t) >= 2:
            out["tokens_per_s"] = tokens_per_step * (len(step_t) - 1) / (step_t[-1] - step_t[0])
        out["wall_s"] = time.perf_counter() - t0
    except torch.OutOfMemoryError:
        out["status"] = "oom"
        out["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
    finally:
        import shutil

        shutil.rmtree(inp.out, ignore_errors=True)
    return out


def run_child(script: Path, payload: Any, args: list[str]) -> dict[str, Any]:
    """One measurement in its own process (a fresh CUDA allocator and peak counter): `script --one payload`
    prints `RESULT {json}`; a child that dies without one comes back as an error with its output's tail."""
    p = subprocess.run([sys.executable, str(script), "--one", json.dumps(payload), *args], capture_output=True,
                       text=True, cwd=ROOT)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {"status": "error", "error": (p.stderr or p.stdout)[-2500:]}
    return json.loads(lines[-1][7:])


# --- comparison -----------------------------------------------------------------------------------------------


def predict(c: dict[str, Any]) -> dict[str, Any]:
    from medgpt_ray.memory.estimator import TrainSetup, estimate
    from medgpt_ray.memory.shapes import load_shape

    setup = TrainSetup(stage=c["stage"], method=c["method"], precision=c["precision"], micro_batch=c["micro_batch"],
                       seq_len=c["seq_len"], ckpt_fraction=c["ckpt_fraction"], fused_ce=c["fused_ce"],
                       zero=c["zero"], offload=c["offload"], gpus=1, optim=c["optim"], lora_rank=c["lora_rank"],
                       fused_kernels=bool(c.get("fused_kernels")))
    est = estimate(load_shape(c["model"]), setup)
    return {"predicted_gib": est.peak_gib, "breakdown_gib": est.breakdown_gib()}


def compare(runs: list[dict[str, Any]], budget_gib: float) -> dict[str, Any]:
    errs, rel = [], []
    unsafe = []
    for r in runs:
        if r.get("status") != "ok" or "predicted_gib" not in r:
            continue
        m, p = r["peak_allocated_gib"], r["predicted_gib"]
        r["error_pct"] = round(100 * (p - m) / m, 2)
        r["error_gib"] = round(p - m, 3)
        # FIELD-NOTES: small peaks are dominated by fixed overheads; judge by max(relative, 0.5 GiB absolute).
        judged = 0.0 if abs(p - m) <= 0.5 else abs(p - m) / m
        errs.append(judged)
        rel.append(abs(p - m) / m)
        # A run predicted to fit the 24 GiB card whose measured peak would not: the failure that matters.
        if p <= budget_gib and (m > CAP_24_GIB or r["peak_reserved_gib"] > CAP_24_GIB):
            unsafe.append(r["id"])
    return {
        "runs_compared": len(errs),
        "median_abs_error_pct": round(100 * statistics.median(errs), 2) if errs else None,
        "max_abs_error_pct": round(100 * max(errs), 2) if errs else None,
        "median_abs_relative_error_pct": round(100 * statistics.median(rel), 2) if rel else None,
        "max_abs_relative_error_pct": round(100 * max(rel), 2) if rel else None,
        "predicted_fit_but_over_24gib": unsafe,
        "fit_budget_gib": budget_gib,
    }


def attach_predictions(doc: dict[str, Any]) -> None:
    for r in doc["runs"]:
        try:
            r.update(predict(r))
        except ImportError:
            return
    doc["fit_budget_gib"] = CAP_24_GIB - 2.0
    doc["predictions"] = ("predicted_gib is recomputed from the configuration by this checkout's estimator "
                          "(`--repredict`); the estimator's fitted constants were calibrated on these measurements")
    doc["summary"] = compare(doc["runs"], doc["fit_budget_gib"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/medgpt-calib")
    ap.add_argument("--out", help="results JSON")
    ap.add_argument("--lanes", type=int, default=2, help="configurations measured at once (one process each)")
    ap.add_argument("--cap-gib", type=float, default=64.0, help="per-process allocator cap while measuring")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated substrings of the configuration ids to run")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--repredict", help="a results JSON: recompute predictions with this checkout's estimator")
    a = ap.parse_args()

    if a.one:
        print("RESULT " + json.dumps(measure_one(json.loads(a.one), Path(a.workdir), a.cap_gib, a.steps)), flush=True)
        return
    if a.repredict:
        doc = json.loads(Path(a.repredict).read_text())
        attach_predictions(doc)
        Path(a.repredict).write_text(json.dumps(doc, indent=1) + "\n")
        print(json.dumps(doc["summary"], indent=1))
        return

    import torch

    from medgpt_ray.tiny import ensure_tiny

    work = Path(a.workdir)
    configs = [c for c in matrix() if any(part in cfg_id(c) for part in a.only.split(","))]
    t0 = time.time()
    tok_dir = ensure_tiny()
    for name in sorted({c["model"] for c in configs}):
        prepare_model(name, work / "models", tok_dir)
        print(f"[{time.time() - t0:6.1f}s] model {name} ready", flush=True)
    prepare_data(work / "data")

    done: list[dict[str, Any]] = []

    def child(c: dict[str, Any]) -> dict[str, Any]:
        r = run_child(Path(__file__), c, ["--workdir", str(work), "--cap-gib", str(a.cap_gib), "--steps", str(a.steps)])
        if r["status"] == "error":
            r = {"id": cfg_id(c), **c, **r}
        print(f"[{time.time() - t0:6.1f}s] {r['id']}: {r['status']} "
              f"{r.get('peak_allocated_gib', 0):.2f} GiB {r.get('tokens_per_s', 0):.0f} tok/s", flush=True)
        done.append(r)
        if a.out:  # partial results survive a run cut short by the device's time limit
            Path(a.out + ".partial").write_text(json.dumps(done) + "\n")
        return r

    # 7B runs first: the longest, so the lanes finish together.
    configs.sort(key=lambda c: c["model"] != "qwen2.5-7b")
    with ThreadPoolExecutor(a.lanes) as pool:
        runs = list(pool.map(child, configs))
    doc = {
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name(0),
        "versions": {m: __import__(m).__version__ for m in ("torch", "transformers", "trl", "peft", "deepspeed")},
        "cap_gib": a.cap_gib, "steps": a.steps, "lanes": a.lanes,
        # What the planner calls "fits" a 24 GiB card: budget less its default 2 GiB margin.
        "fit_budget_gib": CAP_24_GIB - 2.0,
        "runs": runs,
    }
    attach_predictions(doc)
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc.get("summary", {}), indent=1))


if __name__ == "__main__":
    main()
