"""A stage kind may be registered by any module imported after config/pipeline.py (config/__init__.py imports the
kinds' config modules; a kinds/<kind>/config.py is one more line there): a config that gives no `stages:` still
gets every kind registered by the time it is validated, with the kind's defaults."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from medgpt_ray.config import STAGE_KINDS, PipelineConfig, StageConfig, StageKind, register_stage_kind


class LateConfig(StageConfig):
    """A kind registered after PipelineConfig was defined."""

    note: str = "late"


@pytest.fixture
def late():
    kind = register_stage_kind(StageKind("late", LateConfig, data_kind="sft", default_from="sft",
                                         defaults={"enabled": False, "lr": 1e-4}, memory_model="sft"))
    yield kind
    del STAGE_KINDS["late"]


def test_a_kind_registered_late_is_in_a_config_without_stages(late):
    cfg = PipelineConfig.model_validate({"model": {"path": "tiny"}})
    assert cfg.stages.kinds() == list(STAGE_KINDS)
    assert isinstance(cfg.stages.get("late"), LateConfig)
    assert cfg.stages.get("late").lr == 1e-4 and not cfg.stages.get("late").enabled  # the kind's own defaults


def test_a_validated_config_is_frozen():
    """Validation returns the resolved config; nothing changes it afterwards (a change is a new validation)."""
    cfg = PipelineConfig.model_validate({"model": {"path": "tiny"}, "stages": {"eval": {"enabled": True}}})
    assert cfg.stages.get("eval").needs  # resolved by validation: eval compares the other enabled stages
    for target, key in ((cfg, "seed"), (cfg.resources, "num_workers"), (cfg.stages.get("sft"), "lr"),
                        (cfg.stages, "sft")):
        with pytest.raises(ValidationError, match="frozen"):
            setattr(target, key, getattr(target, key))
