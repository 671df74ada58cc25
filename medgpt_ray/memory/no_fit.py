"""Why nothing fits: the smallest predicted peak, what the config fixed, and the nearest changes that would fit
(QLoRA, a shorter seq_len, more GPUs with ZeRO-3, offload; for generating kinds their own), each with its peak."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from medgpt_ray.config import StageConfig
from medgpt_ray.memory.budget import Budget, gib
from medgpt_ray.memory.candidates import Candidate, candidate
from medgpt_ray.memory.estimator import TrainSetup
from medgpt_ray.memory.generation import peak as estimate
from medgpt_ray.memory.generation import rl_hints
from medgpt_ray.memory.profiles import kind_memory
from medgpt_ray.memory.shapes import ModelShape


def explain_no_fit(stage: str, cfg: StageConfig, shape: ModelShape, cands: list[Candidate], budget: Budget,
                    explicit: list[str]) -> str:
    best = min(cands, key=lambda c: c.peak_gib)
    lines = [f"stages.{stage}: nothing fits {budget.describe()}.",
             f"  smallest predicted peak: {gib(best.peak_gib)} with {best.label()}"]
    host_bound = [c for c in cands if c.peak_gib <= budget.usable_gib]
    if host_bound:
        least = min(host_bound, key=lambda c: c.host_node_gib)
        lines.append(f"  {len(host_bound)} configuration(s) fit the GPU only with CPU offload, which needs at least "
                     f"{gib(least.host_node_gib)} of host RAM per node ({least.label()}) > "
                     f"{gib(budget.host_usable_gib)} usable: add RAM or set resources.host_memory_gib if it is "
                     f"more than was read")
    if explicit:
        lines.append(f"  fixed by the config: {', '.join(explicit)}")
    smallest = 1 if cfg.min_micro_batch == 1 else min(c.setup.micro_batch for c in cands)  # kto: at least 2
    s0 = replace(best.setup, micro_batch=smallest, ckpt_fraction=1.0)
    usable = budget.usable_gib

    def option(label: str, setup: TrainSetup) -> str:
        c = candidate(shape, setup, budget)
        return (f"{label}: {gib(c.peak_gib)}{f' + {gib(c.host_node_gib)} host RAM/node' if c.host_node_gib else ''} "
                f"({'fits' if c.fits(budget) else 'still over'})")

    hints = []
    if best.setup.micro_batch > s0.micro_batch:  # a micro-batch the config fixed
        hints.append(option(f"micro_batch {s0.micro_batch}", s0))
    # A generating stage: fewer generations, the kind's own (shorter completions, ...), QLoRA, the reward model's place
    hints += rl_hints(shape, s0, usable, kind_memory(stage).hints(cfg, s0))
    if s0.method != "qlora" and budget.gpu_gib is not None and not best.setup.generations:  # QLoRA needs a GPU
        hints.append(option("method qlora", replace(s0, method="qlora", precision="bf16", zero=0, offload="none")))
    for seq in (cfg.seq_len // 2, cfg.seq_len // 4, cfg.seq_len // 8):
        if seq >= 64 and estimate(shape, replace(s0, seq_len=seq)).peak_gib <= usable:
            hints.append(option(f"seq_len {seq}", replace(s0, seq_len=seq)))
            break
    hints += zero3_hints(shape, s0, usable, option)
    if hints:
        lines.append(f"  other options at micro-batch {s0.micro_batch} with full checkpointing: " + "; ".join(hints))
    return "\n".join(lines)


def zero3_hints(shape: ModelShape, s0: TrainSetup, usable: float,
                option: Callable[[str, TrainSetup], str]) -> list[str]:
    """ZeRO-3 over the fewest GPUs whose share of the weights (and what DeepSpeed gathers) fits, and ZeRO-3 with
    the parameters offloaded to the CPU on the stage's own GPUs. 4-bit weights cannot be sharded: a QLoRA setup is
    priced as bf16 LoRA (a MoE's fused experts are 16-bit under QLoRA anyway). With `lora.experts` (refused under
    ZeRO-3: memory/expert_lora.py) they are priced without the expert adapters and say so."""
    base, switch = s0, ""
    if s0.lora_experts:
        base, switch = replace(s0, lora_experts=False), "lora.experts false, "
    if s0.method == "qlora":
        base, switch = replace(base, method="lora", precision="bf16"), f"{switch}method lora (bf16), "
    hints = []
    for n in (2, 4, 8, 16):
        sharded = replace(base, zero=3, offload="none", gpus=n)
        # More GPUs; or, where a key changes too, the stage's own (their ZeRO-3 was not searched with the key on).
        more = n > s0.gpus or (switch and n == s0.gpus)
        if more and estimate(shape, sharded).peak_gib <= usable:
            hints.append(option(f"{switch}ZeRO-3 over {n} GPUs", sharded))
            break
    gpus = f"{s0.gpus} GPU" + ("s" if s0.gpus > 1 else "")
    hints.append(option(f"{switch}ZeRO-3 with parameter+optimizer offload on {gpus}",
                        replace(base, zero=3, offload="all")))
    return hints
