"""`medgpt-ray export`: a finished stage of a run as a clean model directory to hand on: the weights in the dtype
asked for, the tokenizer with the chat template the run trained with, a model card (README.md) naming the stages
that made it (each with its data's hashes, steps, losses and held-out results) and the same as medgpt_export.json.
No record text goes into the card: the data are named by file and SHA-256."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from medgpt_ray.config import PipelineConfig, run_evaluator, stage_kind
from medgpt_ray.run.dag import effective_from
from medgpt_ray.run.manifest import write_json_atomic
from medgpt_ray.stages.outputs import HELD_OUT

DTYPES = ("bf16", "fp16", "fp32")


class ExportError(ValueError):
    """The run, stage or output directory cannot be exported; the message says why and what would."""


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ExportError(f"{path} is missing: not a run directory of medgpt-ray (runs/<name>/)")
    return json.loads(path.read_text(encoding="utf-8"))


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def lineage(cfg: PipelineConfig, stage: str) -> list[str]:
    """The stages whose training the exported model carries, first to last (the base model's first `from`)."""
    chain = [stage]
    while (up := effective_from(cfg, chain[0])) is not None:
        chain.insert(0, up)
    return chain


def _stage_card(run_dir: Path, cfg: PipelineConfig, stage: str, entry: dict[str, Any]) -> dict[str, Any]:
    result = entry.get("result", {})
    kind = stage_kind(stage).data_kind
    splits = {p.name: file_sha256(p) for p in sorted((run_dir / "data").glob(f"{kind}.*.parquet"))}
    plan = entry.get("plan", {})
    return {"stage": stage, "from": effective_from(cfg, stage) or "base model", "data_kind": kind,
            "data_sha256": splits, "steps": result.get("steps"), "train_loss_first": result.get("train_loss_first"),
            "train_loss_last": result.get("train_loss_last"), HELD_OUT: result.get(HELD_OUT, {}),
            "method": plan.get("method"), "precision": plan.get("precision"), "finished_at": entry.get("finished_at"),
            "fingerprint": entry.get("fingerprint")}


# The eval stage's numbers for one model (kinds/eval: results.json's models.<stage>), as the card names them.
EVAL_ROWS = (("heldout", "loss", "held-out loss (responses)"), ("heldout", "perplexity", "held-out perplexity"),
             ("pretrain_heldout", "perplexity", "pretraining text perplexity"),
             ("answers", "mean_reward", "mean reward of its answers (judge: the rm)"),
             ("answers", "mean_new_tokens", "mean answer tokens"),
             ("exam", "loglik_accuracy", "exam accuracy: log-likelihood (per token)"),
             ("exam", "loglik_sum_accuracy", "exam accuracy: log-likelihood (sum)"),
             ("exam", "generated_accuracy", "exam accuracy: generated letter"))


def _cell(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def eval_table(e: dict[str, Any]) -> list[str]:
    """The eval stage's results for the exported model as a Markdown table: one row per number it has, the win
    rate over the reference with its 95% CI and counts."""
    rows = [(label, e[group][key]) for group, key, label in EVAL_ROWS
            if isinstance(e.get(group), dict) and e[group].get(key) is not None]
    lines = [f"## Eval stage (against `{e.get('reference')}`)", "", "| measure | value |", "|---|---|"]
    lines += [f"| {label} | {_cell(v)} |" for label, v in rows]
    w = e.get("win_rate")
    if w:
        lines.append(f"| win rate over {e.get('reference')} | {_cell(w['win_rate'])} (95% CI {_cell(w['ci95'][0])} "
                     f"- {_cell(w['ci95'][1])}; {w['wins']} wins, {w['ties']} ties, {w['losses']} losses of "
                     f"{w['prompts']} prompts) |")
    return lines


def _card_markdown(info: dict[str, Any]) -> str:
    lines = ["---", "library_name: transformers", "tags: [medical, medgpt-ray, " + ", ".join(info["lineage"]) + "]",
             "---", "", f"# {info['run']} / {info['stage']}", "",
             f"Trained by medgpt-ray (code {info['git_commit']}) from `{info['base_model']}`, through "
             f"{' -> '.join(info['lineage'])}; chat template `{info['template']}`; weights in {info['dtype']}.", "",
             "| stage | from | data | steps | loss first -> last | held-out |", "|---|---|---|---|---|---|"]
    for s in info["stages"]:
        data = "<br>".join(f"{name} `{h[:16]}`" for name, h in s["data_sha256"].items()) or "-"
        loss = (f"{s['train_loss_first']:.3f} -> {s['train_loss_last']:.3f}"
                if s["train_loss_first"] is not None and s["train_loss_last"] is not None else "-")
        numbers = [(k, v) for k, v in s[HELD_OUT].items() if isinstance(v, int | float) and not isinstance(v, bool)]
        held = ", ".join(f"{k.removeprefix('eval_')}={v if isinstance(v, int) else f'{v:.3f}'}"
                         for k, v in numbers) or "-"
        lines.append(f"| {s['stage']} ({s['method']}) | {s['from']} | {data} | {s['steps']} | {loss} | {held} |")
    if info.get("eval_stage"):  # the run's eval stage compared this model (docs/stages.md: the eval stage)
        lines += ["", *eval_table(info["eval_stage"])]
    lines += ["", "Data hashes are SHA-256 of the prepared Parquet splits in the run's data/ directory (the "
              "full values in medgpt_export.json). Held-out results are the run's own (its held-out split).", ""]
    return "\n".join(lines)


def vision_base(base: str | None, model_dir: Path) -> Path | None:
    """The run's base checkpoint where it is a vision-language one (Qwen3.5's `qwen3_5`: a vision tower and a
    `text_config`) whose text model the stage trained: stages load and train the text model only (models.py), so
    the export puts the base's vision tower back around it. None for any other base."""
    if not base or not (Path(base) / "config.json").is_file():
        return None
    composite = json.loads((Path(base) / "config.json").read_text(encoding="utf-8"))
    text = composite.get("text_config")
    if "vision_config" not in composite or not isinstance(text, dict):
        return None
    trained = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    return Path(base) if trained.get("model_type") == text.get("model_type") else None


PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json")


def _with_vision_tower(text_model: Any, base: Path, out: Path, dtype: Any) -> None:
    """Save the base's vision-language model with the trained text model in place of its own: the vision tower (and
    the base's image/video processor configs) as the base has them, in the export's dtype (a bf16 base exported in
    bf16 or fp32 keeps every value), the decoder and LM head trained."""
    import shutil

    from transformers import AutoModelForImageTextToText

    composite = AutoModelForImageTextToText.from_pretrained(base, dtype=dtype, local_files_only=True)
    composite.get_decoder().load_state_dict(text_model.get_decoder().state_dict())  # strict: every weight matched
    composite.get_output_embeddings().load_state_dict(text_model.get_output_embeddings().state_dict())
    composite.save_pretrained(out, safe_serialization=True)
    for name in PROCESSOR_FILES:
        if (base / name).is_file():
            shutil.copyfile(base / name, out / name)


def _save_model(model_dir: Path, out: Path, dtype: str, seq_cls: bool, vision: Path | None) -> None:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    from medgpt_ray import models

    hf_logging.disable_progress_bar()  # our two lines say what happens

    auto = AutoModelForSequenceClassification if seq_cls else AutoModelForCausalLM
    model = auto.from_pretrained(model_dir, dtype=models.torch_dtype(dtype), local_files_only=True)
    if vision is not None:
        _with_vision_tower(model, vision, out, models.torch_dtype(dtype))
    else:
        model.save_pretrained(out, safe_serialization=True)
    models.load_tokenizer(model_dir).save_pretrained(out)  # with the run's chat template (stages/outputs.py)


def _check_out(out: Path, run_dir: Path, overwrite: bool) -> None:
    """ExportError for an --out the export must not write: inside the run (a stage's own weights would be replaced
    by the export, in place), not empty without --overwrite, or, with it, holding anything but an earlier export
    (--overwrite replaces an export, never a directory of other files)."""
    resolved, run = out.resolve(), run_dir.resolve()
    if resolved == run or run in resolved.parents or resolved in run.parents:
        raise ExportError(f"--out {out} is inside the run directory {run_dir} (or holds it): the export would "
                          "replace what the run keeps; choose a directory outside the run")
    if not out.exists() or not any(out.iterdir()):
        return
    if not overwrite:
        raise ExportError(f"--out {out} is not empty; choose another directory or pass --overwrite")
    if not (out / "medgpt_export.json").is_file():
        raise ExportError(f"--out {out} holds files but no earlier export (no medgpt_export.json): --overwrite "
                          "replaces an earlier export only; choose an empty directory")


def export_stage(run_dir: Path, stage: str, out: Path, dtype: str = "bf16", overwrite: bool = False,
                 echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Write `stage`'s model of the run at `run_dir` to `out`; returns what medgpt_export.json holds."""
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype}: one of {', '.join(DTYPES)}")
    run_dir, out = Path(run_dir), Path(out)
    manifest = _read(run_dir / "manifest.json")
    finished = manifest.get("stages", {})
    if stage not in finished:
        raise ExportError(f"--stage {stage}: not a finished stage of {run_dir} (finished: "
                          f"{', '.join(sorted(finished)) or 'none'})")
    if not stage_kind(stage).trains:
        raise ExportError(f"--stage {stage}: the {stage} stage trains no model; export one of the stages it compared")
    model_dir = Path(finished[stage].get("output_model") or run_dir / stage / "model")
    if not (model_dir / "config.json").is_file():
        raise ExportError(f"{model_dir}: the stage's model is gone (moved or deleted after the run)")
    _check_out(out, run_dir, overwrite)
    cfg = PipelineConfig.model_validate(_read(run_dir / "config.resolved.json"))
    chain = lineage(cfg, stage)
    info = {"run": manifest["run"]["config"].get("name", run_dir.name), "stage": stage, "dtype": dtype,
            "base_model": manifest["run"].get("base_model_path"), "git_commit": manifest["run"].get("git_commit"),
            "template": cfg.template_for(stage), "lineage": chain,
            "stages": [_stage_card(run_dir, cfg, s, finished[s]) for s in chain if s in finished]}
    evaluator = run_evaluator()  # the stage that compared the run's models (eval), if the run has one
    evaluation = ((finished.get(evaluator, {}) if evaluator else {}).get("result") or {}).get("evaluation") or {}
    if stage in evaluation.get("models", {}):
        info["eval_stage"] = {"reference": evaluation["reference"], **evaluation["models"][stage],
                              "win_rate": evaluation["win_rates"].get(stage)}
    seq_cls = stage_kind(stage).sequence_classifier
    vision = None if seq_cls else vision_base(info["base_model"], model_dir)
    if vision is not None:
        info["vision_tower"] = f"copied untouched from {vision}, in {dtype} (the stages trained its text model)"
    if out.exists() and overwrite:  # an earlier export (_check_out): replaced whole, none of its files left behind
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    echo(f"[export] {stage} of {run_dir} -> {out} ({dtype})")
    if vision is not None:
        echo(f"[export] {vision} is a vision-language checkpoint: its vision tower is copied untouched, the text "
             f"model is the trained one")
    _save_model(model_dir, out, dtype, seq_cls, vision)
    (out / "README.md").write_text(_card_markdown(info), encoding="utf-8")
    write_json_atomic(out / "medgpt_export.json", info)
    echo(f"[export] done: {out} (model card README.md, medgpt_export.json)")
    return info
