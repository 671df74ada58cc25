"""A stage's training steps traced on fake tensors: the peak of what PyTorch allocates, by category and phase, on a
CPU-only machine (issue 34; bench/README.md, "fake_trace.py").

The model is built from a config.json on the meta device, set up as the SFT stage sets it up (PEFT LoRA on the
default targets, or full training; the weights' dtype from the precision; TRL's fused LM head, which the SFT trainer
always adds; non-reentrant gradient checkpointing of the first `ckpt_fraction` of the decoder layers,
trainer_kit/checkpointing.py), then its parameters become fake CPU tensors (torch's FakeTensorMode: shapes, dtypes and
autograd, no storage, no compute) and torch's MemTracker follows every tensor through forward, backward and AdamW's
step. Steps are lists of rows' lengths; each micro-batch is padded to its longest row (mb 1: no padding).

What a CPU trace cannot see (say so next to any number it gives): CUDA-only allocations (cuBLAS/cuDNN workspaces,
the caching allocator's rounding) and kernels that differ by device. TRL's fused head folds its vocabulary tiles in
Triton on CUDA and in torch ops here: its CPU-only temporaries ([tokens, 32768] fp32 tiles, several at once) are
reported apart (`cpu_only_head_gib`, the peak with the head's folds costed as on CUDA). SDPA picks the CPU kernel;
on the GPU flash/efficient attention keep the same O(tokens) output and logsumexp.

    python bench/fake_trace.py --family qwen3.5-0.8b --method lora --ckpt 1.0 --steps 2048
    python bench/fake_trace.py --config-dir DIR --method full --steps 2048x1 --steps 800 --micro-batch 1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
GIB = 2**30


def build_model(config: Any, method: str, precision: str, ckpt_fraction: float, lora_rank: int = 8) -> Any:
    """The causal LM of `config` on the meta device, set up as the SFT stage does (see the module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from medgpt_ray.config.base import LoraConfig
    from medgpt_ray.models import lora_config, torch_dtype
    from medgpt_ray.trainer_kit.checkpointing import decoder_layers

    config.use_cache = False
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(precision), attn_implementation="sdpa")
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))  # what SFTTrainer adds
    if method != "full":
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(LoraConfig(rank=lora_rank), "CAUSAL_LM", model))
    if ckpt_fraction > 0:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        layers = decoder_layers(model)
        for layer in layers[round(ckpt_fraction * len(layers)):]:  # SelectiveCheckpointing's switch
            layer.gradient_checkpointing = False
    model.train()
    return model


def to_fake(model: Any) -> None:
    """Every meta parameter and buffer replaced by a fake CPU tensor of its shape (tied weights stay tied). Call
    inside the FakeTensorMode that will run the model."""
    import torch

    made: dict[int, Any] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                if id(p) not in made:
                    made[id(p)] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype), p.requires_grad)
                module._parameters[name] = made[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = torch.empty(b.shape, dtype=b.dtype)


class _NoHook:
    def remove(self) -> None:
        pass


def phase_tracker(model: Any) -> Any:
    """torch's MemTracker, keeping the global peak only (its per-module snapshots make every op O(modules)) and the
    phase the peak happened in (`phase`, set by the caller). Frozen parameters get no gradient hook (MemTracker
    would try to register one and fail on LoRA's frozen base)."""
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker

    class PhaseTracker(MemTracker):
        phase = "setup"
        peak_phase = "setup"
        phase_peaks: dict[str, int] = {}

        def _update_peak_stats(self, peak_state: Any) -> None:
            for dev, snap in self._curr_mem_snap.items():
                if self.phase_peaks.get(self.phase, 0) < snap[_TOTAL_KEY]:
                    self.phase_peaks[self.phase] = snap[_TOTAL_KEY]
                if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                    self._peak_mem[dev] = snap[_TOTAL_KEY]
                    self._peak_mem_snap[dev] = dict(snap)
                    self.peak_phase = self.phase

    tracker = PhaseTracker()
    for p in model.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
    return tracker


def _batch(lengths: list[int], vocab: int) -> dict[str, Any]:
    """A micro-batch of rows of these lengths, right-padded to the longest: padding masked and never a label."""
    import torch

    width = max(lengths)
    ids = torch.randint(0, vocab, (len(lengths), width))
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def _no_op(*args: Any, **kwargs: Any) -> None:
    return None


def cuda_head() -> Any:
    """A context in which TRL's fused head costs what it costs on CUDA: its per-tile folds (Triton kernels there,
    torch ops with [tokens, chunk] fp32 temporaries here) and its fp32 GEMM accumulation (cuBLAS' out_dtype there,
    fp32 copies of both operands here) allocate nothing; its tile buffer, gathered hidden states and fp32 gradient
    accumulators stay. Values are fake, so skipping the folds changes no shape."""
    import contextlib

    from trl.kernels import chunked_logprob as head

    stack = contextlib.ExitStack()
    for name in ("_forward_tile", "_backward_tile", "_addmm_fp32"):
        original = getattr(head, name)
        setattr(head, name, _no_op)
        stack.callback(setattr, head, name, original)
    return stack


def cuda_dropout() -> Any:
    """A context in which dropout keeps what it keeps on CUDA: torch's CPU dropout multiplies by a noise tensor of the
    input's dtype and size and saves it for backward (4 bytes an element under fp32 LoRA adapters), CUDA's fused
    native_dropout saves a bool mask (1 byte). PEFT's LoRA dropout runs on every adapted input: traced the CPU way,
    a Qwen2.5-0.5B LoRA micro-batch of 8 x 1,024 tokens without checkpointing kept 5.6 GiB more than on CUDA."""
    import contextlib

    import torch
    import torch.nn.functional as F

    def native(x: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        return torch.native_dropout(x, p, training)[0] if training and p > 0 else x

    stack = contextlib.ExitStack()
    original = F.dropout
    F.dropout = native
    stack.callback(setattr, F, "dropout", original)
    return stack


def _phase(tracker: Any, name: str) -> None:
    tracker.phase = name
    if name.endswith("forward"):
        tracker.reset_mod_stats()  # MemTracker refuses a module's second forward otherwise


def _loss(model: Any, batch: dict[str, Any], backbone_only: bool) -> tuple[Any, Any]:
    """The SFT trainer's loss (TRL's fused head: the labels' summed NLL over their count), or with `backbone_only`
    the decoder's output summed (no LM head: the layers' own memory, as tests compare it with the planner's)."""
    if backbone_only:
        out = model.get_base_model().model if hasattr(model, "get_base_model") else model.model
        hidden = out(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
        return hidden, hidden.last_hidden_state.sum()
    out = model(**batch, use_cache=False, fused_lm_head=True)
    return out, (-out.log_probs).sum() / out.label_mask.sum().clamp(min=1)


def run_steps(model: Any, steps: list[list[list[int]]], vocab: int, backbone_only: bool = False,
              autocast: bool = False) -> dict[str, Any]:
    """Trace `steps` (each a list of micro-batches, each a list of row lengths) of forward, backward (gradients
    accumulating over the step's micro-batches), gradient clipping and fused AdamW; the peak, its categories, the
    phase it happened in and each phase's own peak, in GiB. Call inside FakeTensorMode, after to_fake. `backbone_only`:
    see _loss; `autocast`: the forward under bf16 autocast (the Trainer's bf16=True, precisions bf16 and amp-bf16:
    stages/trainer_args.py; CPU autocast casts fewer ops than CUDA's)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, fused=True)  # HF's adamw_torch_fused on the GPU
    tracker = phase_tracker(model)
    tracker.track_external(model, optimizer)
    with tracker:
        for k, micro_batches in enumerate(steps, 1):
            for j, rows in enumerate(micro_batches, 1):
                batch = _batch(rows, vocab)
                _phase(tracker, f"step {k} mb {j} forward")
                with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                    out, loss = _loss(model, batch, backbone_only)
                _phase(tracker, f"step {k} mb {j} backward")
                loss.backward()
                del out, loss
            _phase(tracker, f"step {k} optimizer")
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    snap = next(iter(tracker._peak_mem_snap.values()), {})
    return {"peak_gib": round(max(tracker._peak_mem.values(), default=0) / GIB, 4), "phase": tracker.peak_phase,
            "breakdown_gib": {str(getattr(k, "value", k)): round(v / GIB, 4) for k, v in snap.items() if v},
            "phase_peaks_gib": {k: round(v / GIB, 4) for k, v in tracker.phase_peaks.items()}}


def trace(config: Any, method: str, precision: str, ckpt_fraction: float, steps: list[list[list[int]]],
          head: str = "cuda", lora_rank: int = 8) -> dict[str, Any]:
    """The traced peak of `steps` of training the model of `config` (see run_steps); `head` "cuda" costs TRL's fused
    head as on the GPU (cuda_head), "cpu" as it runs here, "none" leaves the head out (run_steps' backbone_only)."""
    import contextlib

    from torch._subclasses.fake_tensor import FakeTensorMode

    model = build_model(config, method, precision, ckpt_fraction, lora_rank)
    with FakeTensorMode(allow_non_fake_inputs=True), cuda_dropout(), \
            (cuda_head() if head == "cuda" else contextlib.nullcontext()):
        to_fake(model)
        return run_steps(model, steps, config.get_text_config().vocab_size, head == "none",
                         precision in ("bf16", "amp-bf16"))


def _steps(specs: list[str], micro_batch: int) -> list[list[list[int]]]:
    """'2048' -> one step of one micro-batch of one row; '2048x32' -> 32 rows; '2048,800': rows of those lengths.
    Rows go into micro-batches of `micro_batch` in order."""
    steps = []
    for spec in specs:
        rows: list[int] = []
        for part in spec.split(","):
            n, _, times = part.partition("x")
            rows += [int(n)] * int(times or 1)
        steps.append([rows[i:i + micro_batch] for i in range(0, len(rows), micro_batch)])
    return steps


def _config(a: argparse.Namespace) -> Any:
    from transformers import AutoConfig

    if a.family:
        sys.path[:0] = [str(BENCH)]
        import family_models

        return family_models.family_config(a.family)
    return AutoConfig.from_pretrained(a.config_dir, local_files_only=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--config-dir", help="a directory with the model's config.json")
    where.add_argument("--family", help="a bench/family_models.py name, e.g. qwen3.5-0.8b")
    ap.add_argument("--method", choices=("lora", "full"), default="lora")
    ap.add_argument("--precision", choices=("bf16", "amp-bf16", "fp32"), default="bf16")
    ap.add_argument("--ckpt", type=float, default=1.0, help="share of decoder layers checkpointed (first ones)")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--steps", action="append", required=True,
                    help="one optimizer step's rows: 2048 | 2048x32 | 2048,1500,800 (repeat for more steps)")
    ap.add_argument("--head", choices=("cuda", "cpu", "none"), default="cuda")
    ap.add_argument("--out", help="write the result JSON here too")
    a = ap.parse_args()
    t0 = time.monotonic()
    result = trace(_config(a), a.method, a.precision, a.ckpt, _steps(a.steps, a.micro_batch), a.head, a.lora_rank)
    result = {"command": " ".join(["python", *sys.argv]), **result, "trace_s": round(time.monotonic() - t0, 1)}
    print(json.dumps(result, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    sys.path[:0] = [str(BENCH.parent)]
    main()
