"""Loading a config: YAML read (every error names the file), `--overrides FILE` and `--set a.b=v` applied as
dotted keys, then validated once (every error names the source and the dotted key)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from medgpt_ray.config.base import ConfigError, _format_validation_error
from medgpt_ray.config.clean import CleanConfig
from medgpt_ray.config.pipeline import PipelineConfig


def load_clean_config(path: str | Path | None, sets: list[str] | None = None) -> CleanConfig:
    tree: dict[str, Any] = _read_yaml(Path(path)) if path else {}
    for s in sets or []:
        parts, value = parse_set(s)
        apply_override(tree, parts, value, f"--set {s}")
    try:
        return CleanConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, str(path or "--set"))) from None


def parse_set(assignment: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a","b","c"], value parsed as YAML so numbers and bools keep their type)."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE with a dotted KEY")
    key, raw = assignment.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set {assignment!r}: empty key")
    if not raw.strip():
        return parts, ""
    try:
        return parts, yaml.safe_load(raw)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ConfigError(f"--set {assignment!r}: the value is not valid YAML ({problem}); quote it if it is "
                          "meant as a string") from None


def apply_override(tree: dict[str, Any], parts: list[str], value: Any, source: str) -> None:
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: '{'.'.join(parts[: i + 1])}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {e.start}); a config is YAML text") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}{_yaml_where(e)}: invalid YAML: {_yaml_problem(e)}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return tree


def _yaml_where(e: yaml.YAMLError) -> str:
    """`:line:column` (1-based, as editors count) of a YAML error: PyYAML's own text names "<unicode string>"."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    return f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""


def _yaml_problem(e: yaml.YAMLError) -> str:
    problem = getattr(e, "problem", None)
    context = getattr(e, "context", None)
    if not problem:
        return type(e).__name__
    return f"{problem} ({context})" if context else problem


def load_config(
    path: str | Path, sets: list[str] | None = None, overrides_file: str | Path | None = None
) -> PipelineConfig:
    """Load YAML, then `--overrides FILE` (dotted keys), then each `--set`, then validate once."""
    path = Path(path)
    tree = copy.deepcopy(_read_yaml(path))
    sources = [str(path)]
    if overrides_file is not None:
        ov = _read_yaml(Path(overrides_file))
        for key, value in ov.items():
            apply_override(tree, str(key).split("."), value, str(overrides_file))
        sources.append(str(overrides_file))
    for s in sets or []:
        parts, value = parse_set(s)
        apply_override(tree, parts, value, f"--set {s}")
    if sets:
        sources.append("--set")
    try:
        return PipelineConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, " + ".join(sources))) from None


def resolved_dict(cfg: PipelineConfig) -> dict[str, Any]:
    return cfg.model_dump(mode="json", by_alias=True)  # `from`, as the YAML says it
