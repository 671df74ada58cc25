"""Per-memory-kind profiles and each kind's memory terms (kinds/<kind>/memory.py, found by memory/profiles.py):
every stage kind has a profile, memory/ asks it instead of naming kinds, a kind's own keys reach its TrainSetup from
its own config class, and what the planner refuses or searches per kind is what the profile says."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import medgpt_ray.kinds as kinds_pkg
import medgpt_ray.memory as memory_pkg
from medgpt_ray.config import STAGE_KINDS, ConfigError, PipelineConfig
from medgpt_ray.memory import profiles
from medgpt_ray.memory.estimator import SetupError, TrainSetup, estimate
from medgpt_ray.memory.kind_memory import KindMemory
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.memory.profiles import memory_kinds, memory_profile, setup_fields, stage_profile
from medgpt_ray.memory.shapes import PRESETS

MEMORY_DIR = Path(memory_pkg.__file__).parent
KINDS_DIR = Path(kinds_pkg.__file__).parent
PROFILES = {kind: memory_profile(kind) for kind in memory_kinds()}


def test_every_stage_kind_has_a_memory_profile():
    assert list(PROFILES) == ["pt", "sft", "rm", "dpo", "orpo", "kto", "grpo", "opd"]
    for name, kind in STAGE_KINDS.items():
        assert kind.memory_kind in PROFILES, name
        assert stage_profile(name) is PROFILES[kind.memory_kind]
        assert PROFILES[kind.memory_kind].name == kind.memory_kind


def test_each_kinds_memory_module_is_a_registered_kinds_and_only_memory_kinds_hold_a_profile():
    """kinds/<kind>/memory.py declares MEMORY; a kind that follows another's memory model holds no profile."""
    modules = sorted(p.parent.name for p in KINDS_DIR.glob("*/memory.py"))
    assert modules == ["dpo", "grpo", "kto", "opd", "orpo", "pt", "rloo", "rm", "sft", "simpo"]
    for name in modules:
        memory = profiles.kind_memory(name)
        assert isinstance(memory, KindMemory) and memory is sys.modules[f"medgpt_ray.kinds.{name}.memory"].MEMORY
        assert (memory.profile is not None) is (STAGE_KINDS[name].memory_kind == name), name
    assert profiles.kind_memory("eval") is profiles.NO_MODULE  # follows sft's model, reads none of its keys


def test_a_kind_memory_module_that_fails_to_import_is_an_error_not_a_missing_module(tmp_path, monkeypatch):
    (tmp_path / "fake_kinds" / "broken").mkdir(parents=True)
    (tmp_path / "fake_kinds" / "broken" / "memory.py").write_text("import medgpt_ray_no_such_module\n")
    (tmp_path / "fake_kinds" / "plain").mkdir()
    for d in ("", "broken", "plain"):
        (tmp_path / "fake_kinds" / d / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(profiles, "KIND_PACKAGE", "fake_kinds")
    profiles.kind_memory.cache_clear()
    try:
        assert profiles.kind_memory("plain") is profiles.NO_MODULE
        assert profiles.kind_memory("absent") is profiles.NO_MODULE
        with pytest.raises(ModuleNotFoundError, match="medgpt_ray_no_such_module"):
            profiles.kind_memory("broken")
    finally:
        profiles.kind_memory.cache_clear()


def _kinds_named(tree: ast.AST) -> list[str]:
    """Kind names a module holds as a string (compared, a dict key, an argument, anything) or imports by name."""
    found = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in STAGE_KINDS]
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        found += [n for n in names if n.startswith("medgpt_ray.kinds.")]
    return found


def test_no_memory_module_names_a_kind():
    """Kinds are found through the registry: memory/ (profiles.py too) holds no kind's name and imports no kind."""
    offenders = {}
    for path in sorted(MEMORY_DIR.glob("*.py")):
        names = _kinds_named(ast.parse(path.read_text()))
        if names:
            offenders[path.name] = names
    assert offenders == {}


def test_the_name_check_can_fail():
    assert _kinds_named(ast.parse("x = s == 'rm'\nd = {'dpo': 1}\nf('grpo')\n")) == ["rm", "dpo", "grpo"]
    assert _kinds_named(ast.parse("from medgpt_ray.kinds.opd.memory import MEMORY\n")) == [
        "medgpt_ray.kinds.opd.memory"]


def test_memory_probes_no_config_attribute():
    """A kind's keys are read from its own config class in its memory module: no getattr/hasattr in memory/."""
    probes = {p.name: [n.func.id for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Call)
                       and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")]
              for p in sorted(MEMORY_DIR.glob("*.py"))}
    assert {k: v for k, v in probes.items() if v} == {}


def _fields(stage: str, **keys) -> dict:
    cfg = PipelineConfig.model_validate({"model": {"path": "tiny"}, "data": {"prompt": ["p.jsonl"]},
                                         "stages": {stage: {"enabled": True, **keys}}})
    return setup_fields(stage, cfg.stages.get(stage), False)


def test_a_kinds_own_keys_reach_its_train_setup():
    assert _fields("simpo") == {"nll_term": False} and _fields("simpo", cpo_alpha=0.5) == {"nll_term": True}
    assert _fields("orpo") == {"nll_term": True}
    assert _fields("kto") == {"kl_batch": True} and _fields("kto", loss_type="apo_zero_unpaired") == {
        "kl_batch": False}
    assert _fields("dpo", precompute_ref_log_probs=True) == {"dpo_reference": "precomputed"}
    assert _fields("pt") == _fields("sft") == _fields("rm") == _fields("eval") == {}
    grpo = _fields("grpo", num_generations=4, max_completion_length=64, reward_funcs=["reward_model"])
    assert grpo == {"generations": 4, "completion_len": 64, "reward_network": False, "reward_adapter": True,
                    "reward_lora_rank": 8, "reward_model_gpu": False, "reference": False,  # rm's adapter (auto)
                    "generation_path": "auto", "generation_on_gpu": False}  # the decode path's request, the device
    merged = _fields("grpo", reward_funcs=["reward_model"], reward_shared_base=False)
    assert (merged["reward_network"], merged["reward_adapter"], merged["reward_lora_rank"]) == (True, False, 0)
    rloo = _fields("rloo", num_generations=4, reward_model_gpu=True)
    assert (rloo["generations"], rloo["reward_network"], rloo["reward_model_gpu"], rloo["reference"]) == (
        4, False, True, True)  # rloo's beta defaults to 0.05: a reference pass


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
