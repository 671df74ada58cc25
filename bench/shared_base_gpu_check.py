"""The shared base (reward_shared_base) on a GPU, with QLoRA and LoRA: an rm stage trains with the method and keeps
its reward adapter; an rloo stage with the same method scores with that adapter on its own base (a 4-bit base for
QLoRA: PEFT's mixed-batch forward through bitsandbytes' Linear4bit) and trains its own adapter, the reward adapter
untouched; the shared-base scores are set beside the merged rm's (RewardModelScore) on the same texts.

Stage code called in one process, as tests/stages/test_shared_base.py does on the CPU, under a 24 GiB allocator cap:
no Ray, so the wheelhouse is `bash ../shared/gpu/make-wheelhouse.sh --no-ray --bnb` (bitsandbytes instead of ray).
The model is random-init weights of a Qwen2.5 shape (bench/memory_calibration.prepare_model) with the tiny preset's
tokenizer; the data are data/sample/rl's department pairs and prompts (MedicalGPT's formats).

    # the GPU machine:
    python3 bench/shared_base_gpu_check.py --model qwen2.5-0.5b --methods qlora lora --out $OUT/shared_base.json
    # here (CPU; LoRA only, the tiny preset's shape):
    .venv/bin/python bench/shared_base_gpu_check.py --model tiny --methods lora --out /tmp/sbgc.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT), str(BENCH)]

from memory_calibration import GIB, cap_allocator, prepare_model, single_process_env  # noqa: E402

DATA = ROOT / "data" / "sample" / "rl"


def prepared(work: Path) -> dict[str, tuple[str, str]]:
    from medgpt_ray.data.prepare import prepare_kind

    out = {}
    for kind, name in (("preference", "department_pairs.jsonl"), ("prompt", "department_prompts.jsonl")):
        d = prepare_kind(kind, [str(DATA / name)], work / "prepared" / kind, 0.1)
        out[kind] = (str(d.train_file), str(d.eval_file))
    return out


def weights(model: Any, tag: str) -> dict[str, Any]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if f".{tag}." in n}


def planned(stage: str, cfg: Any, shape_name: str, cap_gib: float, use_gpu: bool) -> Any:
    """The plan for the model's shape and a `cap_gib` card (the tiny shape and no budget on the CPU)."""
    from medgpt_ray.memory.budget import make_budget
    from medgpt_ray.memory.planner import plan_stage
    from medgpt_ray.memory.shapes import load_shape

    if not use_gpu:
        return plan_stage(stage, cfg, 1, False)
    return plan_stage(stage, cfg, 1, True, load_shape(shape_name),
                      make_budget(cap_gib, 2.0, "rtx4090", True, "bench cap"))


def run_rm(method: str, model_dir: Path, data: dict, work: Path, a: argparse.Namespace, use_gpu: bool
           ) -> dict[str, Any]:
    from medgpt_ray.config import LoraConfig, StageConfig
    from medgpt_ray.stages import run_stage
    from medgpt_ray.stages.inputs import StageInputs

    cfg = StageConfig(method=method, lora=LoraConfig(rank=16, alpha=32), lr=1e-3, max_steps=4, seq_len=256,
                      effective_batch=8, logging_steps=1, save_steps=100, warmup_ratio=0.0)
    plan = planned("rm", cfg, a.model, a.cap_gib, use_gpu)
    return run_stage(StageInputs("rm", cfg, plan, str(model_dir), "chatml", *data["preference"],
                                 str(work / f"rm-{method}")))


def run_rloo(method: str, model_dir: Path, data: dict, work: Path, rm: dict, a: argparse.Namespace, use_gpu: bool
             ) -> dict[str, Any]:
    import torch
    from transformers import TrainerCallback

    from medgpt_ray.config import LoraConfig, RLOOStageConfig
    from medgpt_ray.stages import run_stage
    from medgpt_ray.stages.inputs import StageInputs
    from medgpt_ray.stages.reward_adapter import ADAPTER_NAME

    cfg = RLOOStageConfig(method=method, lora=LoraConfig(rank=8, alpha=16), lr=5e-4, max_steps=3, seq_len=256,
                          effective_batch=16, num_generations=4, max_completion_length=32, logging_steps=1,
                          save_steps=100, warmup_ratio=0.0, beta=0.05, reward_shared_base=True)
    cfg._rm_lora_rank = 16  # what the pipeline config records from stages.rm.lora.rank
    plan = planned("rloo", cfg, a.model, a.cap_gib, use_gpu)
    seen: dict[str, Any] = {}

    class Snapshot(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            seen["reward"], seen["policy"] = weights(model, ADAPTER_NAME), weights(model, "default")

        def on_train_end(self, args, state, control, model=None, **kwargs):
            after_r, after_p = weights(model, ADAPTER_NAME), weights(model, "default")
            seen["reward_unchanged"] = all(torch.equal(seen["reward"][n], after_r[n]) for n in after_r)
            seen["policy_changed"] = any(not torch.equal(seen["policy"][n], after_p[n]) for n in after_p)
            seen["reward_tensors"], seen["policy_tensors"] = len(after_r), len(after_p)

    if use_gpu:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    r = run_stage(StageInputs("rloo", cfg, plan, str(model_dir), "chatml", *data["prompt"],
                              str(work / f"rloo-{method}"), needs={"rm": rm["output_model"]}), callbacks=[Snapshot()])
    return {"steps": r["steps"], "reward_model_scored_by": r.get("reward_model_scored_by"),
            "wall_s": round(time.perf_counter() - t0, 1), "planned_peak_gib": round(plan.prediction.peak_gib, 2),
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / GIB, 2) if use_gpu else None,
            **{k: v for k, v in seen.items() if k not in ("reward", "policy")}}


def compare_scores(method: str, model_dir: Path, rm: dict, use_gpu: bool) -> dict[str, Any]:
    """The shared-base scores of the policy's base (loaded with `method`) + the reward adapter, beside the merged
    rm's on the same prompts and completions."""
    from peft import get_peft_model

    from medgpt_ray import models
    from medgpt_ray.config import LoraConfig
    from medgpt_ray.stages.reward_adapter import SharedBaseScore, reward_adapter_for
    from medgpt_ray.stages.rewards import RewardModelScore

    rows = [json.loads(line) for line in (DATA / "department_pairs.jsonl").read_text(encoding="utf-8").splitlines()]
    prompts = [f"<|im_start|>user\n{r['conversations'][0]['value']}<|im_end|>\n<|im_start|>assistant\n"
               for r in rows[:32]]
    completions = [r["chosen"] for r in rows[:32]] + [r["rejected"] for r in rows[:32]]
    prompts = prompts + prompts
    base = models.load_causal_lm(model_dir, "bf16" if use_gpu else "fp32", method)
    if use_gpu and method != "qlora":  # bitsandbytes puts a 4-bit model on the GPU itself
        base = base.to("cuda")
    policy = get_peft_model(base, models.lora_config(LoraConfig(rank=8, alpha=16), "CAUSAL_LM", base))
    shared = SharedBaseScore(reward_adapter_for(rm["output_model"], str(model_dir), "rloo"), rm["output_model"])
    shared.attach(policy)
    a = shared(prompts, completions)
    b = RewardModelScore(rm["output_model"], device="cuda" if use_gpu else "cpu")(prompts, completions)
    diffs = [abs(x - y) for x, y in zip(a, b, strict=True)]
    spread = statistics.pstdev(b) or 1.0
    agree = sum((x1 > x2) == (y1 > y2) for x1, x2, y1, y2 in zip(a[:32], a[32:], b[:32], b[32:], strict=True))
    return {"pairs": 32, "max_abs_diff": round(max(diffs), 4), "mean_abs_diff": round(statistics.fmean(diffs), 4),
            "merged_score_std": round(spread, 4), "same_preference_of_pair": agree}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--methods", nargs="+", default=["qlora", "lora"])
    ap.add_argument("--cap-gib", type=float, default=24.0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/sbgc"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch

    from medgpt_ray.tiny import ensure_tiny

    single_process_env()
    use_gpu = torch.cuda.is_available()
    if use_gpu:
        cap_allocator(args.cap_gib)
    tiny = ensure_tiny()  # the tokenizer of every shape here
    model_dir = tiny if args.model == "tiny" else prepare_model(args.model, args.work / "models", tiny)
    data = prepared(args.work)
    doc: dict[str, Any] = {"command": " ".join(["python3", *sys.argv]), "model": args.model, "cap_gib": args.cap_gib,
                           "device": torch.cuda.get_device_name() if use_gpu else "cpu", "runs": {}}
    for method in args.methods:
        run: dict[str, Any] = {}
        doc["runs"][method] = run
        try:
            rm = run_rm(method, model_dir, data, args.work, args, use_gpu)
            run["rm"] = {"steps": rm["steps"], "reward_adapter": rm.get("reward_adapter")}
            run["rloo"] = run_rloo(method, model_dir, data, args.work, rm, args, use_gpu)
            run["scores"] = compare_scores(method, model_dir, rm, use_gpu)
            run["status"] = "ok"
        except Exception as err:  # recorded, and the next method still runs; the exit status says it failed
            run["status"], run["error"] = "failed", f"{type(err).__name__}: {err}"[:2000]
        print(json.dumps({method: run}, indent=1), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    sys.exit(0 if all(r.get("status") == "ok" for r in doc["runs"].values()) else 1)


if __name__ == "__main__":
    main()
