"""`medgpt-ray export` on the shared tiny run: the exported directory is the stage's model in the dtype asked for,
with the run's chat template and a model card whose data hashes are the run's prepared splits; bad requests are
refused with the reason."""

from __future__ import annotations

import json

import pytest
import torch

from medgpt_ray.run.export import ExportError, export_stage, file_sha256

pytestmark = pytest.mark.ray


def test_a_finished_stage_exports_with_its_card(tiny_run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "exported"
    info = export_stage(tiny_run.run_dir, "sft", out, "bf16", echo=lambda _: None)
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    source = AutoModelForCausalLM.from_pretrained(tiny_run.run_dir / "sft" / "model", local_files_only=True)
    ids = torch.tensor([[5, 17, 42, 7, 99]])
    with torch.no_grad():  # the same network, only rounded to bf16
        a, b = source(ids).logits, model.float()(ids).logits
    assert torch.allclose(a, b, atol=0.1, rtol=0.05) and not torch.equal(a, b)
    assert AutoTokenizer.from_pretrained(out).chat_template  # the template the run trained with
    card = (out / "README.md").read_text(encoding="utf-8")
    train = tiny_run.run_dir / "data" / "sft.train.parquet"
    assert file_sha256(train)[:16] in card and info["lineage"] == ["sft"]
    assert json.loads((out / "medgpt_export.json").read_text())["stages"][0]["data_sha256"]["sft.train.parquet"] \
        == file_sha256(train)
    assert "| sft (lora) | base model |" in card  # pt is disabled in the shared run: sft starts from the base

    with pytest.raises(ExportError, match="not empty"):
        export_stage(tiny_run.run_dir, "sft", out, echo=lambda _: None)
    # --overwrite replaces an earlier export whole: nothing of it is left beside the new one (issue 48 item 9)
    (out / "stale.safetensors").write_bytes(b"old")
    export_stage(tiny_run.run_dir, "sft", out, "fp32", overwrite=True, echo=lambda _: None)
    assert not (out / "stale.safetensors").exists() and json.loads((out / "medgpt_export.json").read_text())[
        "dtype"] == "fp32"
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    with pytest.raises(ExportError, match="no earlier export"):
        export_stage(tiny_run.run_dir, "sft", other, overwrite=True, echo=lambda _: None)
    assert (other / "mine.txt").read_text() == "keep"
    weights = sorted(p.name for p in (tiny_run.run_dir / "sft" / "model").iterdir())
    with pytest.raises(ExportError, match="inside the run directory"):  # the stage's own weights, in place
        export_stage(tiny_run.run_dir, "sft", tiny_run.run_dir / "sft" / "model", overwrite=True, echo=lambda _: None)
    assert sorted(p.name for p in (tiny_run.run_dir / "sft" / "model").iterdir()) == weights
    with pytest.raises(ExportError, match=r"--stage dpo: not a finished stage .* \(finished: sft\)"):
        export_stage(tiny_run.run_dir, "dpo", tmp_path / "x", echo=lambda _: None)
    with pytest.raises(ExportError, match="manifest.json is missing"):
        export_stage(tmp_path, "sft", tmp_path / "y", echo=lambda _: None)
