"""The `stages:` section, which validates each registered kind by its config class (the kinds' classes and
registrations are in kinds/<kind>/config.py, docs/ARCHITECTURE.md "The stage-kind contract": a new kind is a folder
of kinds/ with a stage module, a config class and a registry entry)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from medgpt_ray.config.base import _NestedErrors
from medgpt_ray.config.registry import STAGE_KINDS
from medgpt_ray.config.stage import StageConfig


class StagesConfig(BaseModel):
    """One entry per registered stage kind, validated by that kind's config class; a kind not given gets its
    defaults. An unknown kind is an error."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _by_kind(cls, data: Any) -> Any:
        if isinstance(data, StagesConfig):
            return data
        given = dict(data or {})
        unknown = [k for k in given if k not in STAGE_KINDS]
        if unknown:
            raise ValueError(f"unknown stage kind '{unknown[0]}' (registered: {', '.join(STAGE_KINDS)})")
        out = {}
        for name, kind in STAGE_KINDS.items():
            value = given.get(name, {})
            if isinstance(value, StageConfig):
                value = value.model_dump(by_alias=True, exclude_unset=True)
            try:
                out[name] = kind.config_class.model_validate({**kind.defaults, **value})
            except ValidationError as e:
                raise _NestedErrors([{**err, "loc": (name, *err["loc"])} for err in e.errors()]) from None
        return out

    def get(self, stage: str) -> StageConfig:
        return getattr(self, stage)

    def kinds(self) -> list[str]:
        return list(self.__pydantic_extra__ or {})
