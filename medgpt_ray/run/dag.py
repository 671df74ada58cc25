"""The stage graph as data: whose model each stage starts from (`from`), what else it reads (`needs`), waves,
forced reruns, fingerprints. Pure: no Ray.

By default pt -> sft -> {rm, dpo} (config.STAGE_KINDS); a disabled `from` hands over its own input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from medgpt_ray.config import PipelineConfig, StageKind, stage_kind
from medgpt_ray.memory.stage_plan import StagePlan
from medgpt_ray.run.manifest import sha256_json


def effective_from(cfg: PipelineConfig, stage: str) -> str | None:
    """The enabled stage whose model `stage` starts from; None: the base model (ARCHITECTURE.md: a disabled
    stage's dependants start from its input)."""
    return cfg.start_of(stage)


def dependencies(cfg: PipelineConfig, stage: str) -> list[str]:
    """The enabled stages that must finish before `stage` starts: its effective `from` and its `needs`."""
    up = effective_from(cfg, stage)
    return [*([up] if up else []), *cfg.stages.get(stage).needs]


def waves(cfg: PipelineConfig, stages: list[str]) -> list[list[str]]:
    """Stages grouped so each starts after every stage it depends on; rm and dpo share a wave."""
    out: list[list[str]] = []
    placed: dict[str, int] = {}
    for s in stages:  # in dependency order (PipelineConfig.enabled_stages)
        idx = max((placed[d] + 1 for d in dependencies(cfg, s) if d in placed), default=0)
        while len(out) <= idx:
            out.append([])
        out[idx].append(s)
        placed[s] = idx
    return out


def downstream(cfg: PipelineConfig, start: str, order: list[str]) -> set[str]:
    """`start` and every stage of `order` that depends on it, directly or not."""
    found = {start}
    for s in order:
        if any(d in found for d in dependencies(cfg, s)):
            found.add(s)
    return found


def forced_stages(cfg: PipelineConfig, order: list[str], from_stage: str | None,
                  only_stage: str | None) -> set[str]:
    """The stages that rerun whatever the manifest says: --only-stage S alone, --from-stage S and downstream."""
    if only_stage:
        return {only_stage}
    if from_stage:
        return downstream(cfg, from_stage, order)
    return set()


def fingerprint(cfg: PipelineConfig, stage: str, plan: StagePlan, data_fp: str, upstream_fp: str | None,
                base_config: dict[str, Any], prov: dict[str, Any], needs_fps: dict[str, str] | None = None) -> str:
    """A finished stage is reused only under the same fingerprint: its config less the memory knobs (explicit or
    planned, StageConfig.training_identity), the plan's identity, its data, its upstream's fingerprint, the base
    model, its template and the code."""
    return sha256_json({
        "stage": stage, "config": cfg.stages.get(stage).training_identity(), "plan": plan.identity(),
        "data": data_fp, "upstream": upstream_fp, "base_model": base_config, "template": cfg.template_for(stage),
        "code": {"git_commit": prov["git_commit"], "packages": prov["packages"]},
        **({"needs": needs_fps} if needs_fps else {}),
    })


def stage_data_fingerprint(kind: StageKind, data_fps: dict[str, str]) -> str:
    """The fingerprint of the data a stage kind reads: its own kind's, and with `reads` (eval) those kinds' too."""
    if not kind.reads:
        return data_fps[kind.data_kind]
    return sha256_json({k: data_fps[k] for k in (kind.data_kind, *kind.reads)})


def stage_fingerprints(cfg: PipelineConfig, plans: dict[str, StagePlan], data_fps: dict[str, str],
                       base_config: dict[str, Any], prov: dict[str, Any]) -> dict[str, str]:
    """Each enabled stage's fingerprint, upstream first, from the fingerprints of the data kinds (`data_fps`)."""
    fingerprints: dict[str, str] = {}
    for s in cfg.enabled_stages():
        up = effective_from(cfg, s)
        needs = {n: fingerprints[n] for n in cfg.stages.get(s).needs}
        data_fp = stage_data_fingerprint(stage_kind(s), data_fps)
        fingerprints[s] = fingerprint(cfg, s, plans[s], data_fp, fingerprints.get(up) if up else None,
                                      base_config, prov, needs)
    return fingerprints


def stages_to_run(cfg: PipelineConfig, order: list[str], forced: set[str], done: Callable[[str], bool]
                  ) -> list[str]:
    """The stages of `order` that run: the forced ones, those not `done` (finished under their fingerprint), and
    every stage of `order` downstream of one that reruns."""
    to_run = [s for s in order if s in forced or not done(s)]
    for s in cfg.enabled_stages():
        if any(d in to_run for d in dependencies(cfg, s)) and s not in to_run and s in order:
            to_run.append(s)
    return to_run
