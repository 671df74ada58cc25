"""Where does a 7B LoRA SFT step's time go on a fast GPU, and what takes it back?

The planner's SFT choice for a 24 GiB card (Qwen2.5-7B shape, LoRA r8 all-linear, seq 2048,
micro-batch 4 x accumulation 2) is run through the real stage code, as planned (decoder layers compiled,
bf16 LoRA inputs, the sync-free SFT loss: stages/speed.py, trainer_kit/sync_free.py) and with each of those taken
away; "eager" is the same knobs as the planner ran them before (Liger layer kernels instead of compile,
peft's fp32 input casts, TRL's per-micro-batch syncs). "planned-profiled" adds torch.profiler's tables.

    python bench/step_overhead_probe.py --workdir /tmp/calib --out $OUT/step_overhead_probe_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import memory_calibration as calib  # noqa: E402
import throughput_outcome as outcome  # noqa: E402


def _profile(built, out: dict[str, Any]) -> None:
    import torch
    from transformers import TrainerCallback

    class Profile(TrainerCallback):
        prof = None

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                torch.cuda.synchronize()
                self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                               torch.profiler.ProfilerActivity.CUDA])
                self.prof.__enter__()
                self.t0 = time.perf_counter()
            elif state.global_step == 4 and self.prof is not None:
                torch.cuda.synchronize()
                wall = time.perf_counter() - self.t0
                self.prof.__exit__(None, None, None)
                ka = self.prof.key_averages()
                gpu_us = sum(e.self_device_time_total for e in ka
                             if e.device_type == torch.autograd.DeviceType.CUDA)  # kernels, not the aten ops
                out["profile"] = {
                    "wall_s": wall, "gpu_kernel_s": gpu_us / 1e6, "gpu_busy_fraction": gpu_us / 1e6 / wall,
                    "kernels": sum(e.count for e in ka if e.device_type == torch.autograd.DeviceType.CUDA),
                    "top_gpu": ka.table(sort_by="self_device_time_total", row_limit=15, max_name_column_width=60),
                    "top_cpu": ka.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60),
                }
                self.prof = None

    built.trainer.add_callback(Profile())


def _trl_loss(built, out: dict[str, Any]) -> None:
    """TRL's own compute_loss and HF's NaN filter: the per-micro-batch syncs back."""
    built.trainer.sync_free = False  # trainer_kit/sync_free.py: every micro-batch to TRL's compute_loss
    built.trainer.args.logging_nan_inf_filter = True


# Each variant starts from the planned run (compiled layers, bf16 LoRA inputs, sync-free SFT loss) and takes
# things away: configuration changes for memory_calibration.measure_one (`lora_input_casts` puts peft's fp32
# input casts back), then a hook on the built trainer. "eager" is what the planner ran before (Liger layer
# kernels, no compile, peft's casts, TRL's syncs).
CASTS = {"lora_input_casts": True}
EAGER = {"compile": False}
VARIANTS: dict[str, tuple[dict[str, Any], Any]] = {
    "planned": ({}, None),
    "planned-trl-loss": ({}, _trl_loss),
    "planned-lora-casts": (CASTS, None),
    "eager": ({**EAGER, **CASTS}, _trl_loss),
    "eager-bf16-inputs": (EAGER, _trl_loss),
    "planned-profiled": ({}, _profile),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/medgpt-calib")
    ap.add_argument("--out")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--variants", default="planned,planned-trl-loss,planned-lora-casts,eager,eager-bf16-inputs")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        name, cfg = json.loads(a.one)
        changes, hook = VARIANTS[name]
        r = calib.measure_one({**cfg, **changes}, Path(a.workdir), outcome.CAP_GIB, a.steps, hook)
        print("RESULT " + json.dumps(r), flush=True)
        return

    from medgpt_ray.tiny import ensure_tiny

    work = Path(a.workdir)
    t0 = time.time()
    calib.prepare_model("qwen2.5-7b", work / "models", ensure_tiny())
    calib.prepare_data(work / "data")
    print(f"[{time.time() - t0:6.1f}s] model ready", flush=True)
    sft = outcome.planned("sft", 2048)
    results = []
    for name in a.variants.split(","):
        r = calib.run_child(Path(__file__), [name, sft["run"]], ["--workdir", str(work), "--steps", str(a.steps)])
        r["variant"] = name
        results.append(r)
        prof = r.get("profile", {})
        print(f"[{time.time() - t0:6.1f}s] {name}: {r.get('status')} {r.get('peak_allocated_gib', 0):.2f} GiB "
              f"{r.get('tokens_per_s', 0):,.0f} tokens/s gpu-busy {prof.get('gpu_busy_fraction', 0):.2f}",
              flush=True)
        if r.get("status") == "error":
            print(r["error"][-1500:], flush=True)
        if a.out:
            Path(a.out).write_text(json.dumps({"command": " ".join(sys.argv), "plan": sft["plan"],
                                               "runs": results}, indent=1) + "\n")
    for r in results:
        if "profile" in r:
            print(r["variant"], r["profile"]["top_gpu"], r["profile"]["top_cpu"], sep="\n")


if __name__ == "__main__":
    main()
