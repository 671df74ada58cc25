"""The planner's candidates: every combination of the searched knob values as a TrainSetup, scored by the
estimator (peak memory) and the throughput model (tokens/s), and the rejected alternatives a plan records."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

from medgpt_ray.config import ConfigError, StageConfig, stage_kind
from medgpt_ray.memory.budget import Budget, gib
from medgpt_ray.memory.decode_terms import decode_path
from medgpt_ray.memory.estimator import Estimate, TrainSetup
from medgpt_ray.memory.generation import generation_choices
from medgpt_ray.memory.generation import peak as estimate
from medgpt_ray.memory.options import compiles, liger_for
from medgpt_ray.memory.profiles import setup_fields
from medgpt_ray.memory.rollout_host import experts_fit_merged, host_room_gib
from medgpt_ray.memory.setup import merges_adapters
from medgpt_ray.memory.shapes import ModelShape
from medgpt_ray.memory.throughput import tokens_per_second


class PlanError(ConfigError):
    """Nothing fits (or the explicit configuration does not): the message carries the numbers."""

    smallest_peak_gib: float | None = None


@dataclass
class Candidate:
    setup: TrainSetup
    est: Estimate
    tokens_per_s: float
    host_node_gib: float = 0.0  # CPU offload's host RAM on one node: per worker x workers on the node

    def fits(self, budget: Budget) -> bool:
        return self.peak_gib <= budget.usable_gib and self.host_node_gib <= budget.host_usable_gib

    def why_not(self, budget: Budget) -> str:
        if self.peak_gib > budget.usable_gib:
            return f"peak {gib(self.peak_gib)} > budget {gib(budget.usable_gib)}"
        return (f"CPU offload needs {gib(self.host_node_gib)} of host RAM per node > "
                f"{gib(budget.host_usable_gib)} usable")

    @property
    def peak_gib(self) -> float:
        return self.est.peak_gib

    def knobs(self) -> dict[str, Any]:
        s = self.setup
        return {"method": s.method, "micro_batch": s.micro_batch, "grad_accum": s.grad_accum,
                "ckpt_fraction": s.ckpt_fraction, "fused_ce": s.fused_ce, "fused_kernels": s.fused_kernels,
                "zero_stage": s.zero, "offload": s.offload}

    def label(self) -> str:
        s = self.setup
        ck = {0.0: "no ckpt", 1.0: "full ckpt"}.get(s.ckpt_fraction, f"ckpt {s.ckpt_fraction:.0%}")
        zero = f"ZeRO-{s.zero}" + ("" if s.offload == "none" else f"+offload {s.offload}")
        return (f"{s.method} mb {s.micro_batch}x{s.grad_accum}, {ck}, {'fused CE' if s.fused_ce else 'HF loss'}, "
                f"{'fused layer ops, ' if s.fused_kernels else ''}{zero}")


def setups(stage: str, cfg: StageConfig, shape: ModelShape, opts: dict[str, list[Any]], num_workers: int,
           use_gpu: bool, seq_len: int, packed: bool):
    per_worker = opts["per_worker"][0]
    for method, micro, ck, fused, kernels, optim, (zero, offload) in itertools.product(
            opts["method"], opts["micro"], opts["ckpt"], opts["fused"], opts["kernels"], opts["optim"],
            opts["zero"]):
        precision = cfg.precision if cfg.precision != "auto" else (
            "fp32" if not use_gpu else "amp-bf16" if method == "full" else "bf16")
        if method == "qlora" and zero == 3:
            continue
        compiled = compiles(cfg, use_gpu, method, zero, shape)
        if kernels and not (compiled or liger_for(shape, "layers")):
            continue  # nothing would fuse the layer ops this estimate assumes fused
        for s in generation_choices(replace(TrainSetup(
                stage=stage_kind(stage).memory_kind, method=method, precision=precision, micro_batch=micro,
                seq_len=seq_len, ckpt_fraction=ck, fused_ce=fused, zero=zero, offload=offload, gpus=num_workers,
                optim=optim, lora_rank=cfg.lora.rank, lora_experts=cfg.lora.experts, grad_accum=per_worker // micro,
                fused_kernels=kernels, compiled=compiled, packed=packed), **setup_fields(stage, cfg, use_gpu))):
            if not liger_breaks_decode(shape, s):
                yield s
            elif cfg.fused_kernels is True:
                raise ConfigError(f"stages.{stage}.fused_kernels: true means Liger's layer kernels here (the layers "
                                  f"are not compiled), and they break the compiled decode step of the rollouts into "
                                  f"pieces that CUDA graphs skip: leave it auto, set compile: true, or "
                                  f"generation_path: dynamic")


def liger_breaks_decode(shape: ModelShape, s: TrainSetup) -> bool:
    """Liger's layer kernels (fused ops, layers not compiled) in a stage whose rollouts decode on the compiled static
    path: its kernels are torch.compiler.disable'd, so dynamo breaks the decode step at every layer's RoPE and CUDA
    graphs are skipped (a 1.5B grpo stage on the H200: 16 graphs, 373 generated tokens/s against 2,888 for the same
    step compiled whole). Such a setup is not a candidate: the layers run unfused, as the estimate then assumes."""
    path = decode_path(shape, s)
    return s.fused_kernels and not s.compiled and path is not None and path.compiled


def candidate(shape: ModelShape, setup: TrainSetup, budget: Budget) -> Candidate:
    est = estimate(shape, setup)
    # Merged rollouts copy the adapted weights to the host: lora.experts' experts stay unmerged where they cannot.
    if merges_adapters(setup) and not experts_fit_merged(
            shape, setup, host_room_gib(budget, setup, est)):
        setup = replace(setup, merge_experts=False)
        est = estimate(shape, setup)
    return Candidate(setup, est, tokens_per_second(shape, setup, budget.gpu),
                     est.host_gib * budget.workers_per_node(setup.gpus))


def alternatives(chosen: Candidate, cands: list[Candidate], budget: Budget, n: int = 3) -> list[dict[str, Any]]:
    """The faster configurations that did not fit, then the next best that did, with why."""
    out: list[dict[str, Any]] = []
    faster = sorted((c for c in cands if c.tokens_per_s > chosen.tokens_per_s * 1.0001),
                    key=lambda c: (-c.tokens_per_s, c.peak_gib))
    for c in faster[:n]:
        out.append({**c.knobs(), "peak_gib": round(c.peak_gib, 2),
                    "relative_speed": round(c.tokens_per_s / chosen.tokens_per_s, 3),
                    "why": c.why_not(budget)})
    slower = sorted((c for c in cands if c.fits(budget) and c is not chosen
                     and c.tokens_per_s <= chosen.tokens_per_s), key=lambda c: -c.tokens_per_s)
    for c in slower[:2]:
        rel = c.tokens_per_s / chosen.tokens_per_s
        out.append({**c.knobs(), "peak_gib": round(c.peak_gib, 2), "relative_speed": round(rel, 3),
                    "why": f"fits, predicted {100 * (1 - rel):.0f}% slower"})
    return out
