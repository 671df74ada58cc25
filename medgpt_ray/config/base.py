"""What every config class shares: strictness (an unknown key is an error) and errors that name the key."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Auto = Literal["auto"]
# `packing: by_length`: examples never share a row; padded micro-batches binned by length (trainer_kit/length_bins.py)
ByLength = Literal["by_length"]
BY_LENGTH: ByLength = "by_length"


class ConfigError(ValueError):
    """A configuration problem; the message names the source and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _NestedErrors(ValueError):
    """A stage's own validation errors, reported under `stages.<kind>` by _format_validation_error."""

    def __init__(self, errors: list[Any]):
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
        self.errors = errors


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = []
    errors = []
    for e in err.errors():
        nested = (e.get("ctx") or {}).get("error")
        if isinstance(nested, _NestedErrors):  # a stage's own errors, at their full dotted key
            errors += [{**n, "loc": (*e["loc"], *n["loc"])} for n in nested.errors]
        else:
            errors.append(e)
    for e in errors:
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key '{key}'")
        else:
            lines.append(f"{source}: {key}: {e['msg']}")
    return "\n".join(lines)


class LoraConfig(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    rank: Annotated[int, Field(ge=1)] = 8
    """LoRA rank r."""
    alpha: Annotated[float, Field(gt=0)] = 16
    """LoRA scaling alpha (the update is scaled by alpha / r)."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.05
    """Dropout on the LoRA inputs."""
    targets: str | list[str] = "all-linear"
    """Modules to adapt; "all-linear": every linear layer except the output head (PEFT's selector); on a MoE
    (qwen2_moe, qwen3_moe, qwen3_5_moe) the attention, dense-MLP and shared-expert projections, never the router or
    the routed experts (config/lora_targets.py; those with `lora.experts`)."""
    experts: bool = False
    """Also adapt a MoE's routed experts (qwen2_moe, qwen3_moe, qwen3_5_moe) through PEFT's `target_parameters`: a
    rank-r pair per expert on each fused expert tensor (r x experts x (in + out) weights); the router stays frozen.
    PEFT folds the update into a copy of a routed layer's whole expert weights on every forward: the plan counts it
    (`expert_lora_fold`). `dropout` is 0 with it unless set (PEFT's expert adapters take none: a dropout above 0 is
    refused); refused on a model without routed experts, with method full, and with zero_stage 3 or offload all
    (unvalidated there)."""

    @model_validator(mode="before")
    @classmethod
    def _experts_default_no_dropout(cls, data: Any) -> Any:
        # The 0.05 default would make `experts: true` alone an error; an explicit dropout is the user's and checked.
        if isinstance(data, dict) and data.get("experts") is True and "dropout" not in data:
            return {**data, "dropout": 0.0}
        return data

    @model_validator(mode="after")
    def _experts_without_dropout(self) -> LoraConfig:
        # PEFT's ParamWrapper raises on any lora_dropout: say so at load time, naming both keys.
        if self.experts and self.dropout:
            raise ValueError(f"lora.experts needs lora.dropout 0 (PEFT cannot apply dropout inside an adapter on the "
                             f"fused expert weights); it is {self.dropout}")
        return self
