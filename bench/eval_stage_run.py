"""The eval stage on a Qwen2.5 shape, through the pipeline (issue 19: "the GPU machine runs the eval stage once on
the 1.5B shape, tokens/s quoted").

One pipeline run, exactly as `jobs/pipeline.py` runs it (run/pipeline's Pipeline on local Ray, every stage planned
for --gpu-mem-gib and placed, one worker): sft -> rm -> dpo for --steps optimizer steps each, then the eval stage
(stages.eval) comparing sft and dpo on the held-out split: held-out loss, greedy answers to the held-out prompts
judged by the rm stage (win rate of dpo over sft), and the sample exam (data/sample/exam). The model is random-init
weights of the shape (bench/memory_calibration.prepare_model) with the tiny preset's tokenizer, the data
bench/make_real_length_corpus.py's real-length corpus (as bench/real_length_throughput.py uses). On a GPU every
stage's worker caps its CUDA allocator at --gpu-mem-gib (bench/capped_stage.py), and the eval stage's peak is read
from its worker (capped_stage writes bench_peak.json beside the stage's result).

Random weights answer nothing useful: every answer runs to max_new_tokens and the win rate is noise. What this
measures is the stage's wall time, its generation tokens/s per model, and its peak against the plan.

    # the GPU machine (the wheelhouse with ray etc. installed as in bench/real_length_throughput.py's docstring):
    python3 bench/eval_stage_run.py --model qwen2.5-1.5b --steps 5 --out $OUT
    # here (CPU, the tiny preset, about two minutes):
    .venv/bin/python bench/eval_stage_run.py --model tiny --steps 2 --out /tmp/esr
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT), str(BENCH)]

import capped_stage  # noqa: E402
import pipeline_bench  # noqa: E402
import real_length_throughput as rlt  # noqa: E402

RESULTS = "eval_stage_run.json"
TRAINED = ("sft", "rm", "dpo")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    pipeline_bench.add_pipeline_run_args(ap, "/tmp/medgpt-esr")
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps of each training stage")
    ap.add_argument("--max-prompts", type=int, default=64, help="stages.eval.max_prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="stages.eval.max_new_tokens")
    return pipeline_bench.pipeline_run_defaults(ap.parse_args(argv))


def run_sets(a: argparse.Namespace, model: str, data: dict[str, str], use_gpu: bool) -> list[str]:
    """real_length_throughput's one-stage sets made sft -> rm -> dpo -> eval, with the sample exam."""
    sets = [s for s in rlt.base_sets(a, "sft", "eval-run", model, data, use_gpu)
            if not s.startswith(("stages.", "data.preference="))]
    from medgpt_ray.config import STAGE_KINDS

    sets += [f"data.preference=[{data['preference']}]", f"data.exam=[{ROOT / 'data/sample/exam'}]"]
    sets += [f"stages.{s}.enabled={str(s in (*TRAINED, 'eval')).lower()}" for s in STAGE_KINDS]
    for s in TRAINED:
        sets += [f"stages.{s}.max_steps={a.steps}", f"stages.{s}.logging_steps=1", f"stages.{s}.save_steps=1000000"]
    sets += [f"stages.eval.max_prompts={a.max_prompts}", f"stages.eval.max_new_tokens={a.max_new_tokens}"]
    return sets + a.sets


def eval_numbers(stage_dir: Path) -> dict[str, Any]:
    """The eval stage's results, its wall time, peak and plan, and generated tokens/s per model."""
    results = rlt._read_json(stage_dir / "results.json") or {}
    receipt = rlt._read_json(stage_dir / "result.json") or {}
    plan = rlt._read_json(stage_dir / "plan.json") or {}
    plan.pop("alternatives", None)
    generated: dict[str, Any] = {}
    for name, m in (results.get("models") or {}).items():
        answers = m.get("answers") or {}
        new = round(answers.get("mean_new_tokens", 0) * answers.get("prompts", 0))
        if answers.get("generate_seconds"):
            generated[name] = {"new_tokens": new, "seconds": answers["generate_seconds"],
                               "new_tokens_per_s": round(new / answers["generate_seconds"], 1)}
    peak = rlt._read_json(stage_dir / capped_stage.PEAK_FILE) or {}
    pred = (plan.get("prediction") or {}).get("peak_gib")
    return {"wall_s": receipt.get("wall_s"), "measured_peak_gib": peak.get("max_allocated_gib"),
            "predicted_peak_gib": pred, "generation": generated, "results": results, "plan": plan}


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch

    from medgpt_ray.config import load_config

    use_gpu = torch.cuda.is_available()
    t0 = time.monotonic()
    model, corpus = rlt.prepare(a, use_gpu)
    rlt.start_bench_ray(a, use_gpu)
    sets = run_sets(a, model, corpus["files"], use_gpu)
    doc: dict[str, Any] = {"command": shlex.join(["python", *sys.argv]), **rlt.environment(use_gpu),
                           "gpu_mem_gib": a.gpu_mem_gib if use_gpu else None, "config": a.config, "steps": a.steps,
                           "sets": sets}
    cfg = load_config(a.config, sets)
    run_dir = pipeline_bench.run_fresh_pipeline(cfg, doc)
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    doc["stages"] = {s: {k: v for k, v in rlt.collect(run_dir / s, min(2, a.steps - 1)).items() if k != "plan"}
                     for s in TRAINED}
    doc["eval"] = eval_numbers(run_dir / "eval")
    out = Path(a.out) / RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    ev = doc["eval"]
    print(json.dumps({"status": doc["status"], "eval_wall_s": ev["wall_s"], "peak": ev["measured_peak_gib"],
                      "predicted": ev["predicted_peak_gib"], "generation": ev["generation"],
                      "win_rates": ev["results"].get("win_rates"), "out": str(out)}, indent=1), flush=True)
    return 0 if doc["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
