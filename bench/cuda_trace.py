"""The same steps as bench/fake_trace.py, run for real on a CUDA GPU: torch.cuda.max_memory_allocated per phase, and
the caching allocator's history dumped for torch's memory viewer (https://pytorch.org/memory_viz), so the GPU-only
part of a peak that the CPU trace cannot see (issue 34: ~2.9 MiB a token in a Qwen3.5 linear-attention layer's
rebuild, bench/README.md "fake_trace.py") gets a name: the allocation and its Python stack at the peak.

    python bench/cuda_trace.py --family qwen3.5-0.8b --method lora --ckpt 1.0 --steps 2048 --steps 836 \\
        --snapshot $OUT/q35_lora_2048.pickle --out $OUT/q35_lora_2048.json
    python bench/cuda_trace.py ... --no-cudnn   # the depthwise conv1d without cuDNN (is its workspace the excess?)

Random weights (normal, std 0.02) on the model fake_trace.build_model sets up; same batches, loss and fused AdamW.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

import fake_trace  # noqa: E402


def materialize(model: Any, device: str = "cuda") -> None:
    """The meta model's parameters and buffers on `device`, parameters random (memory does not depend on values), the
    rotary embeddings' buffers computed again (to_empty leaves them uninitialised: a NaN loss otherwise)."""
    import torch

    model.to_empty(device=device)
    model.tie_weights()  # the LM head and the embedding stay one tensor, as loaded
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
        for module in model.modules():
            if "inv_freq" in dict(module.named_buffers(recurse=False)):
                fresh = dict(type(module)(config=module.config).named_buffers())  # on the host
                for name, buffer in module.named_buffers(recurse=False):
                    buffer.copy_(fresh[name])


def run(model: Any, steps: list[list[list[int]]], vocab: int, autocast: bool = False) -> dict[str, Any]:
    """Each phase's torch.cuda.max_memory_allocated (GiB), the overall peak and the phase it was in."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, fused=True)
    phases: dict[str, float] = {}

    def close(name: str) -> None:
        torch.cuda.synchronize()
        phases[name] = round(torch.cuda.max_memory_allocated() / fake_trace.GIB, 4)
        torch.cuda.reset_peak_memory_stats()

    torch.cuda.reset_peak_memory_stats()
    for k, micro_batches in enumerate(steps, 1):
        for j, rows in enumerate(micro_batches, 1):
            batch = {key: t.cuda() for key, t in fake_trace._batch(rows, vocab).items()}
            with torch.autocast("cuda", torch.bfloat16, enabled=autocast):  # bf16, amp-bf16: HF's bf16=True
                out, loss = fake_trace._loss(model, batch, False)
            close(f"step {k} mb {j} forward")
            loss.backward()
            del out, loss
            close(f"step {k} mb {j} backward")
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        close(f"step {k} optimizer")
    phase = max(phases, key=phases.__getitem__)
    return {"peak_gib": phases[phase], "phase": phase, "phase_peaks_gib": phases}


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", required=True, help="a bench/family_models.py name")
    ap.add_argument("--method", choices=("lora", "full"), default="lora")
    ap.add_argument("--precision", choices=("bf16", "amp-bf16", "fp32"), default="bf16")
    ap.add_argument("--ckpt", type=float, default=1.0)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", action="append", required=True, help="as bench/fake_trace.py's --steps")
    ap.add_argument("--no-cudnn", action="store_true", help="torch.backends.cudnn.enabled = False")
    ap.add_argument("--snapshot", help="dump the allocator history here (a pickle for pytorch.org/memory_viz)")
    ap.add_argument("--out")
    a = ap.parse_args()
    import family_models

    torch.backends.cudnn.enabled = not a.no_cudnn
    config = family_models.family_config(a.family)
    model = fake_trace.build_model(config, a.method, a.precision, a.ckpt)
    materialize(model)
    if a.snapshot:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    t0 = time.monotonic()
    result = run(model, fake_trace._steps(a.steps, a.micro_batch), config.get_text_config().vocab_size,
                 a.precision in ("bf16", "amp-bf16"))  # as the stage runs it, and fake_trace.trace
    if a.snapshot:
        torch.cuda.memory._dump_snapshot(a.snapshot)
    result = {"command": " ".join(["python", *sys.argv]), "device": torch.cuda.get_device_name(),
              "cudnn": torch.backends.cudnn.enabled, **result, "wall_s": round(time.monotonic() - t0, 1)}
    print(json.dumps(result, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
