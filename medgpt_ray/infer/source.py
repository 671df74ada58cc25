"""Which model a generation runs and how its prompts are rendered: a finished stage of a run (RUN_DIR/STAGE: its
merged model, and the chat template the run trained it with) or a model directory (its tokenizer's own chat
template, or a named one of ours)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class ModelSourceError(ValueError):
    """--model or --template cannot be used; the message says why and what would."""


@dataclass(frozen=True)
class ModelSource:
    path: Path  # the model directory (config.json, weights, tokenizer)
    template: str | None  # one of ours (medgpt_ray.templates), or None: the tokenizer's own chat template
    stage: str | None = None  # the run stage it came from


def _stage_template(run_dir: Path, stage: str) -> str:
    resolved = run_dir / "config.resolved.json"
    if not resolved.is_file():
        raise ModelSourceError(f"--model {run_dir / stage}: {resolved} is missing, so the template the run trained "
                               "with is unknown; pass --template")
    cfg = json.loads(resolved.read_text(encoding="utf-8"))
    return (cfg.get("stages", {}).get(stage, {}) or {}).get("template") or cfg["model"]["template"]


def resolve_model(model: str, template: str | None = None) -> ModelSource:
    """RUN_DIR/STAGE (its model/ subdirectory, once the stage finished) or a model directory."""
    path = Path(model).expanduser()
    if (path / "model" / "config.json").is_file():  # a stage directory of a run
        stage_template = template or _stage_template(path.parent, path.name)
        return ModelSource(path / "model", stage_template, path.name)
    if (path / "config.json").is_file():
        if template is None and not _has_chat_template(path):
            raise ModelSourceError(f"--model {path}: its tokenizer has no chat template; pass --template NAME "
                                   "(the template it was trained with, e.g. chatml, qwen, llama3)")
        return ModelSource(path, template)
    if (path / "adapter").is_dir() or (path / "plan.json").is_file():
        raise ModelSourceError(f"--model {path}: this stage has no merged model/ yet (not finished, or failed); "
                               "see its result.json and the run's summary")
    raise ModelSourceError(f"--model {path}: neither a model directory (config.json) nor a finished stage of a run "
                           "(RUN_DIR/STAGE with model/)")


def _has_chat_template(path: Path) -> bool:
    config = path / "tokenizer_config.json"
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    return config.is_file() and bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template"))
