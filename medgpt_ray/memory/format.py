"""Plans as people read them: one line per stage for the pipeline's log, a table for `medgpt-ray plan`."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from medgpt_ray.memory.profiles import stage_profile
from medgpt_ray.memory.stage_plan import StagePlan


def _knobs(d: dict[str, Any]) -> str:
    ck = d["ckpt_fraction"]
    ck_s = {0.0: "no ckpt", 1.0: "full ckpt"}.get(ck, f"ckpt {ck:.0%}")
    zero = f"ZeRO-{d['zero_stage']}" + ("" if d["offload"] == "none" else f"+off:{d['offload']}")
    return (f"{d['method']:5s} mb {d['micro_batch']}x{d['grad_accum']:<3d} {ck_s:9s} "
            f"{'fused-CE' if d['fused_ce'] else 'HF-loss ':8s} {'fused ' if d.get('fused_kernels') else ''}{zero}")


def plan_line(p: StagePlan) -> str:
    """One line per stage for the pipeline's log."""
    pred = p.prediction
    ck = {0.0: "no ckpt", 1.0: "full ckpt"}.get(p.ckpt_fraction, f"ckpt {p.ckpt_fraction:.0%} of layers")
    budget = pred.budget_gib if pred else None
    fit = f"predicted peak {pred.peak_gib if pred else 0:.2f} GiB" + (f" of {budget:.1f} GiB" if budget else "")
    if p.packing is not None:
        layout = (f"packed: {p.micro_batch} rows x accum {p.grad_accum} x {p.num_workers} worker(s) "
                  f"(~{p.packing['conversations_per_step']} {stage_profile(p.stage).packed_unit} per "
                  f"worker step)")
    elif p.length_bins is not None:  # a packed plan its worker could not pack (stage_plan.binned)
        layout = (f"padded by length: {p.micro_batch} bins of up to {p.length_bins['bin_tokens']} tokens x accum "
                  f"{p.grad_accum} x {p.num_workers} worker(s) (~{p.length_bins['conversations_per_step']} "
                  f"{stage_profile(p.stage).packed_unit} per worker step)")
    else:
        at = "" if p.seq_len_planned is None else f" at {p.seq_len_planned} tokens"
        layout = f"micro-batch {p.micro_batch}{at} x accum {p.grad_accum} x {p.num_workers} worker(s)"
    if p.attention:
        layout += f", {p.attention} attention"
    return (f"{p.method}, {layout}, {ck}, "
            f"{'fused CE' if p.fused_ce else 'unfused CE'}, "
            f"{'compiled layers, ' if p.compile else 'Liger layer kernels, ' if p.fused_kernels else ''}"
            f"ZeRO-{p.zero_stage}"
            f"{'' if p.offload == 'none' else ' offload ' + p.offload}: {fit}"
            f"{f'; reward model on {p.reward_model_on}' if p.reward_model_on else ''}"
            f"{f'; rollouts: {p.rollout}' if p.rollout else ''}"
            f"{_clip(p.reward_clip)}"
            f"{f'; linear attention on {p.linear_attention}' if p.linear_attention else ''}")


def _clip(clip: dict[str, Any] | None) -> str:
    return "" if not clip else f"; rewards clipped to [{clip['min']:g}, {clip['max']:g}]"


def format_plan(plan: StagePlan) -> list[str]:
    p = asdict(plan.prediction) if plan.prediction else {}
    budget = p.get("budget_gib")
    budget_s = f"{p.get('budget_source', 'host RAM unknown')} (CPU)" if budget is None else \
        f"{budget:.1f} GiB ({p.get('gpu_memory_gib')} - {p.get('margin_gib')} margin)"
    head = (f"stage {plan.stage}: {p.get('model', '?')} on {plan.num_workers} worker(s), budget {budget_s}, "
            f"{p.get('fitting', '?')}/{p.get('candidates', '?')} candidates fit")
    rows = [head, f"  {'':10s}{'configuration':46s} {'peak GiB':>9s} {'speed':>6s}  note"]
    chosen = plan.to_dict()
    host = p.get("host_offload_gib_per_node")
    host_s = "" if not host else (f"; CPU offload {host:.1f} GiB host RAM/node" +
                                  ("" if p.get("host_usable_gib") is None else f" of {p['host_usable_gib']:.1f}"))
    rows.append(f"  {'chosen':10s}{_knobs(chosen):46s} {p.get('peak_gib', 0):9.2f} {1.0:6.2f}  "
                f"{p.get('tokens_per_s_per_gpu', 0):,.0f} tokens/s/GPU predicted on {p.get('gpu', '?')}{host_s}")
    for alt in plan.alternatives:
        tag = "rejected" if not alt["why"].startswith("fits") else "runner-up"
        rows.append(f"  {tag:10s}{_knobs(alt):46s} {alt['peak_gib']:9.2f} {alt['relative_speed']:6.2f}  {alt['why']}")
    for b in plan.backoffs:
        rows.append(f"  back-off after step {b['after_step']}: {b['before']} -> {b['after']}")
    if plan.reward_model_on:
        rows.append(f"  reward model: on {plan.reward_model_on}")
    if plan.rollout:
        rows.append(f"  rollouts: {plan.rollout}")
    if plan.attention:
        rows.append(f"  attention: {plan.attention} (stages.{plan.stage}.attention)")
    if plan.linear_attention:
        rows.append(f"  linear attention: on {plan.linear_attention}")
    if plan.reward_clip:
        rows.append(f"  rewards clipped to [{plan.reward_clip['min']:g}, {plan.reward_clip['max']:g}]: "
                    f"{plan.reward_clip['applied_to']}")
    return rows
