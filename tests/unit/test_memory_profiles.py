"""Per-memory-kind profiles (memory/profiles.py): every stage kind has one, memory/ asks it instead of comparing
kind names, and what the planner refuses or searches per kind is what the profile says."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import medgpt_ray.memory as memory_pkg
from medgpt_ray.config import STAGE_KINDS, ConfigError
from medgpt_ray.memory.estimator import SetupError, TrainSetup, estimate
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.memory.profiles import PROFILES, stage_profile
from medgpt_ray.memory.shapes import PRESETS

MEMORY_DIR = Path(memory_pkg.__file__).parent


def test_every_stage_kind_has_a_memory_profile():
    for name, kind in STAGE_KINDS.items():
        assert kind.memory_kind in PROFILES, name
        assert stage_profile(name) is PROFILES[kind.memory_kind]


def _kind_names_compared(tree: ast.AST) -> list[str]:
    """Kind names a module compares against (==, !=, in, not in a literal), or keys a literal dict by."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for c in [node.left, *node.comparators]:
                elts = c.elts if isinstance(c, ast.Tuple | ast.List | ast.Set) else [c]
                found += [e.value for e in elts if isinstance(e, ast.Constant) and e.value in PROFILES]
        if isinstance(node, ast.Dict):
            found += [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in PROFILES]
    return found


def test_memory_modules_ask_the_profile_instead_of_comparing_kind_names():
    offenders = {}
    for path in sorted(MEMORY_DIR.glob("*.py")):
        if path.name == "profiles.py":
            continue
        names = _kind_names_compared(ast.parse(path.read_text()))
        if names:
            offenders[path.name] = names
    assert offenders == {}


@pytest.mark.parametrize("kind", sorted(PROFILES))
def test_the_planner_refuses_the_fused_ce_a_kind_does_not_allow(kind):
    stage = next(name for name, k in STAGE_KINDS.items() if k.memory_kind == kind and k.trains)
    profile = PROFILES[kind]
    refused = [v for v in (False, True) if v not in profile.fused_ce_allowed]
    cfg_class = STAGE_KINDS[stage].config_class
    for value in refused:
        with pytest.raises(ConfigError) as err:
            plan_stage(stage, cfg_class(fused_ce=value), 1, False)
        assert profile.fused_ce_refusal.format(stage=stage) in str(err.value)
    if not profile.liger_fused_ce:  # the trainer fixes the loss path: the one value it allows is planned
        (allowed,) = profile.fused_ce_allowed
        assert plan_stage(stage, cfg_class(), 1, False).fused_ce is allowed


def test_the_estimator_follows_the_profile():
    shape = PRESETS["qwen2.5-0.5b"]
    for kind, profile in PROFILES.items():
        s = TrainSetup(stage=kind, method="lora", precision="bf16", micro_batch=2, seq_len=256)
        assert s.sequences() == 2 * profile.sequences_per_example
        if profile.fused_ce_setup_error:
            with pytest.raises(SetupError, match="full logits"):
                estimate(shape, TrainSetup(stage=kind, method="lora", precision="bf16", micro_batch=2, seq_len=256,
                                           fused_ce=True))
        full = estimate(shape, TrainSetup(stage=kind, method="full", precision="bf16", micro_batch=2, seq_len=256))
        assert ("reference_model" in full.breakdown) is profile.reference, kind
        assert (estimate(shape, s).breakdown["loss"] == 0) is profile.score_head, kind
