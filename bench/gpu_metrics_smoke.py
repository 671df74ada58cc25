"""On a GPU, without Ray: run a tiny SFT stage with $MEDGPT_RAY_METRICS_PORT set and print the GPU metrics
its prometheus_client endpoint serves (memory vs plan, NVML temperature/power/clock/utilisation/throttle).

    python bench/gpu_metrics_smoke.py > $OUT/gpu_metrics_smoke.txt
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["MEDGPT_RAY_METRICS_PORT"] = str(port)
    from medgpt_ray.config import LoraConfig, StageConfig
    from medgpt_ray.data.prepare import prepare_kind
    from medgpt_ray.memory.budget import make_budget
    from medgpt_ray.memory.planner import plan_stage
    from medgpt_ray.memory.shapes import load_shape
    from medgpt_ray.stages import run_stage
    from medgpt_ray.stages.inputs import StageInputs
    from medgpt_ray.tiny import ensure_tiny

    work = Path(tempfile.mkdtemp())
    data = prepare_kind("sft", [str(ROOT / "data/sample/sft_sharegpt.jsonl")], work, 0.1, max_records=64)
    cfg = StageConfig(method="lora", lora=LoraConfig(rank=8), seq_len=256, effective_batch=8, max_steps=20,
                      logging_steps=1, save_steps=1000)
    plan = plan_stage("sft", cfg, 1, True, load_shape("tiny"), make_budget(24, 2, "auto", True, "smoke"))
    run_stage(StageInputs("sft", cfg, plan, str(ensure_tiny()), "chatml", data.train_file, data.eval_file,
                          str(work / "gpusmoke" / "sft")))
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("ray_medgpt_"):
            print(line)


if __name__ == "__main__":
    main()
