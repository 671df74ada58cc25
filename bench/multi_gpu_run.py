"""Data-parallel stages across the GPUs of one machine, on a Ray head started the way a real node is.

    # on the GPU machine (wheels with ray: bash ../shared/gpu/make-wheelhouse.sh; PATH must reach `ray`)
    python bench/multi_gpu_run.py --workdir /tmp/mg --out $OUT --gpus 1,2,4 --zero 2,3
    # here, the same orchestration on CPU (tiny model, logical workers, no DeepSpeed): a rehearsal
    python bench/multi_gpu_run.py --cpu-rehearsal --workdir /tmp/mg --out /tmp/mg/out --gpus 1,2 --zero 0

1. `nvidia-smi topo -m` of this machine, saved in cluster/topologies/ format (# gpu_name / # p2p headers).
2. `cluster/start-node.sh --head`: one `medgpt_gpu_<i>` resource per GPU, token auth, PCI bus order.
3. A Qwen2.5-0.5B-shape SFT stage (random weights, full fine-tuning, amp-bf16, seq 1024, micro-batch 4 per
   GPU, no checkpointing, eager) through `jobs/pipeline.py` on that head, with DeepSpeed ZeRO-2 then ZeRO-3,
   on 1, 2, 4 Ray Train workers. Weak scaling: every GPU does the same work per step, so per-GPU tokens/s
   should stay flat; it is measured from the per-step log (steps after the first two). For every run: the
   GPUs the placement policy chose (plan.json) and the GPU each worker really ran on
   (torch.cuda.current_device() and its PCI bus id, from result.json), matched to nvidia-smi's indices.
4. The tiny pipeline (pt, sft, rm, dpo, a few steps each) on all the GPUs of the machine.

Results go to OUT/multi_gpu.json after every run (a run cut short keeps what finished).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SEQ_LEN = 1024
MICRO_BATCH = 4


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def gpu_indices_by_bus() -> dict[str, int]:
    """nvidia-smi's index of each GPU by PCI bus id ('0000:00:06' style, as result.json records it)."""
    p = sh(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"])
    out = {}
    for line in p.stdout.strip().splitlines():
        idx, bus = (x.strip() for x in line.split(","))
        # nvidia-smi: 00000000:18:00.0 -> domain 0000, bus 18, device 00
        dom, b, dev_fn = bus.split(":")
        out[f"{int(dom, 16):04x}:{int(b, 16):02x}:{int(dev_fn.split('.')[0], 16):02x}"] = int(idx)
    return out


def save_topology(out: Path) -> dict[str, Any]:
    from medgpt_ray.placement.topology import parse_topo_matrix, read_local_topology

    raw = sh(["nvidia-smi", "topo", "-m"]).stdout
    topo = read_local_topology()
    header = [f"# gpu_name: {topo.gpu_name}"]
    if topo.p2p is not None:
        header.append(f"# p2p: {'on' if topo.p2p else 'off'}")
    header.append(f"# Captured with `nvidia-smi topo -m` on the lent {topo.n}-GPU machine "
                  f"({time.strftime('%Y-%m-%d')}) by bench/multi_gpu_run.py.")
    text = "\n".join(header) + "\n" + raw
    parse_topo_matrix(text, "captured")  # what we save must load
    (out / "topology.txt").write_text(text)
    return {"gpus": topo.n, "gpu_name": topo.gpu_name, "p2p": topo.p2p, "file": "topology.txt"}


def start_head(cpu: bool, log: Path) -> dict[str, str]:
    cmd = ["bash", str(ROOT / "cluster" / "start-node.sh"), "--head"] + (["--cpu-only"] if cpu else [])
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    p = sh(cmd, env=env, cwd=ROOT)
    log.write_text(p.stdout + p.stderr)
    if p.returncode:
        raise SystemExit(f"start-node.sh --head failed (rc {p.returncode}); see {log}:\n{p.stderr[-2000:]}")
    return {**env, "RAY_ADDRESS": "127.0.0.1:6379", "RAY_AUTH_MODE": "token"}


def ray_bin() -> str:
    """The `ray` start-node.sh uses: the project's .venv, else PATH."""
    venv = ROOT / ".venv" / "bin" / "ray"
    return str(venv) if venv.is_file() else (shutil.which("ray") or "ray")


def stop_head() -> None:
    p = sh([ray_bin(), "stop", "--force"])
    if p.returncode:
        print(f"ray stop failed (rc {p.returncode}): {p.stderr[-500:]}", file=sys.stderr)


def sft_config(work: Path, model: Path, data: Path, n: int, zero: int, steps: int, cpu: bool) -> Path:
    cfg = yaml.safe_load((ROOT / "configs" / "tiny-cpu.yaml").read_text())
    cfg["name"] = f"sft-z{zero}-n{n}"
    cfg["output_dir"] = str(work / "runs")
    cfg["model"]["path"] = str(model)
    cfg["data"] = {"sft": [str(data)], "eval_fraction": 0.02}
    cfg["resources"] = {"num_workers": n, "use_gpu": not cpu, "cpus_per_worker": 1 if cpu else 2}
    for s in ("pt", "rm", "dpo"):
        cfg["stages"][s]["enabled"] = False
    cfg["stages"]["sft"] = {
        "method": "full", "precision": "fp32" if cpu else "amp-bf16", "seq_len": SEQ_LEN,
        "micro_batch": MICRO_BATCH, "effective_batch": MICRO_BATCH * n, "grad_ckpt": False, "zero_stage": zero,
        "offload": "none", "compile": False, "lr": 1e-5, "max_steps": steps, "logging_steps": 1,
        "save_steps": 10**6}
    path = work / f"{cfg['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def run_pipeline(args: list[str], env: dict[str, str], log: Path, timeout: float) -> tuple[int, float]:
    t0 = time.monotonic()
    with log.open("w") as fh:
        try:
            p = subprocess.run([sys.executable, str(ROOT / "jobs" / "pipeline.py"), *args], stdout=fh,
                               stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, time.monotonic() - t0


def steady_tokens_per_s(metrics: Path, tokens_per_step: int, skip: int = 2) -> float | None:
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    steps = [(r["step"], r["time_s"]) for r in rows if "loss" in r and r["step"] > skip]
    if len(steps) < 2:
        return None
    (s0, t0), (s1, t1) = steps[0], steps[-1]
    return (s1 - s0) * tokens_per_step / (t1 - t0)


def workers_vs_plan(stage_dir: Path, by_bus: dict[str, int]) -> dict[str, Any]:
    plan = json.loads((stage_dir / "plan.json").read_text())
    result = json.loads((stage_dir / "result.json").read_text())
    chosen = (plan.get("placement") or {}).get("gpus")
    workers = [{**w, "gpu_index": by_bus.get(w.get("pci_bus_id", ""))} for w in result["workers"]]
    ran_on = [w["gpu_index"] for w in workers]
    return {"chosen_gpus": chosen, "placement_cost": (plan.get("placement") or {}).get("cost"),
            "workers": workers, "ran_on": ran_on,
            "ran_on_chosen": chosen is not None and sorted(x for x in ran_on if x is not None) == sorted(chosen),
            "deepspeed": result.get("deepspeed"), "world_size": result.get("world_size"),
            "steps": result.get("steps"), "train_runtime_s": result.get("train_runtime_s")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/medgpt-multi-gpu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpus", default="1,2,4", help="worker counts to measure")
    ap.add_argument("--zero", default="2,3", help="ZeRO stages to measure")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--tiny-steps", type=int, default=2, help="steps per stage of the tiny pipeline (0: skip)")
    ap.add_argument("--run-timeout", type=float, default=240)
    ap.add_argument("--cpu-rehearsal", action="store_true", help="tiny model on CPU: checks the orchestration")
    a = ap.parse_args()

    import memory_calibration as calib

    from medgpt_ray.tiny import ensure_tiny

    work, out = Path(a.workdir), Path(a.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"command": " ".join(sys.argv), "seq_len": SEQ_LEN, "micro_batch_per_gpu": MICRO_BATCH,
                           "steps": a.steps, "runs": [], "tiny_pipeline": None}

    def save() -> None:
        (out / "multi_gpu.json").write_text(json.dumps(doc, indent=1) + "\n")

    t_start = time.monotonic()
    if not a.cpu_rehearsal:
        import torch

        doc["device"] = torch.cuda.get_device_name(0)
        doc["topology"] = save_topology(out)
        by_bus = gpu_indices_by_bus()
        model = calib.prepare_model("qwen2.5-0.5b", work / "models", ensure_tiny())
        doc["versions"] = {m: __import__(m).__version__
                           for m in ("torch", "transformers", "trl", "peft", "deepspeed", "ray")}
    else:
        by_bus, model = {}, ensure_tiny()
    data = calib.prepare_data(work / "data")["sft"]
    env = start_head(a.cpu_rehearsal, out / "ray_start.log")
    try:
        for zero in (int(z) for z in a.zero.split(",")):
            for n in (int(g) for g in a.gpus.split(",")):
                name = f"sft-z{zero}-n{n}"
                cfg = sft_config(work, model, data, n, zero, a.steps, a.cpu_rehearsal)
                rc, wall = run_pipeline(["--config", str(cfg)], env, out / f"{name}.log", a.run_timeout)
                stage_dir = work / "runs" / name / "sft"
                r: dict[str, Any] = {"name": name, "zero": zero, "workers": n, "rc": rc, "wall_s": round(wall, 1)}
                if rc == 0:
                    tps = steady_tokens_per_s(stage_dir / "metrics.jsonl", MICRO_BATCH * n * SEQ_LEN)
                    r.update({"tokens_per_s": tps, "tokens_per_s_per_gpu": tps / n if tps else None,
                              **workers_vs_plan(stage_dir, by_bus)})
                    base = next((x for x in doc["runs"] if x["zero"] == zero and x["workers"] == 1
                                 and x.get("tokens_per_s_per_gpu")), None)
                    if base and r["tokens_per_s_per_gpu"]:
                        r["per_gpu_vs_1_gpu"] = r["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"]
                doc["runs"].append(r)
                save()
                print(f"[{time.monotonic() - t_start:6.1f}s] {name}: rc {rc} {r.get('tokens_per_s_per_gpu') or 0:,.0f} "
                      f"tokens/s/GPU, chosen {r.get('chosen_gpus')} ran on {r.get('ran_on')}", flush=True)
        if a.tiny_steps:
            n = max(int(g) for g in a.gpus.split(","))
            gpu = "false" if a.cpu_rehearsal else "true"
            sets = ["--set", f"resources.num_workers={n}", "--set", f"resources.use_gpu={gpu}",
                    "--set", f"output_dir={work / 'tiny'}", "--set", "name=tiny-multi"]
            for s in ("pt", "sft", "rm", "dpo"):
                sets += ["--set", f"stages.{s}.max_steps={a.tiny_steps}"]
            rc, wall = run_pipeline(["--config", str(ROOT / "configs" / "tiny-cpu.yaml"), *sets], env,
                                    out / "tiny-pipeline.log", a.run_timeout)
            tiny: dict[str, Any] = {"rc": rc, "wall_s": round(wall, 1), "workers": n, "stages": {}}
            for s in ("pt", "sft", "rm", "dpo"):
                d = work / "tiny" / "tiny-multi" / s
                if (d / "result.json").is_file():
                    tiny["stages"][s] = workers_vs_plan(d, by_bus)
            doc["tiny_pipeline"] = tiny
            save()
            print(f"[{time.monotonic() - t_start:6.1f}s] tiny pipeline: rc {rc}, stages done "
                  f"{sorted(tiny['stages'])}", flush=True)
    finally:
        stop_head()
        save()


if __name__ == "__main__":
    main()
