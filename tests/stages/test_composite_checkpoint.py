"""A composite Qwen3.5 checkpoint (issue 34 item 3: `qwen3_5`, a vision tower and a `text_config`, as the real ones
ship): stages load and train its text model only; `medgpt-ray export` writes the vision-language model back, the
vision tower untouched from the base and the text model the trained one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from medgpt_ray import models
from medgpt_ray.config import load_config, resolved_dict
from medgpt_ray.run.export import export_stage

LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
              linear_conv_kernel_dim=3)


@pytest.fixture(scope="module")
def composite(tiny_model, tmp_path_factory) -> Path:
    """A tiny random Qwen3_5ForConditionalGeneration in safetensors, with the tiny tokenizer and a processor file."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig

    tok = models.load_tokenizer(tiny_model)
    text = Qwen3_5TextConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, **LINEAR)
    vision = dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=4,
                  temporal_patch_size=1, spatial_merge_size=2)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("qwen3_5")
    Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text.to_dict(), vision_config=vision)).save_pretrained(
        out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps({"patch_size": 4}))
    return out


def weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(f).items()}


def test_a_stage_loads_the_text_model_of_a_composite_checkpoint(composite):
    model = models.load_causal_lm(composite, "amp-bf16", "lora")
    assert type(model).__name__ == "Qwen3_5ForCausalLM" and model.config.model_type == "qwen3_5_text"
    assert not [n for n, _ in model.named_parameters() if "visual" in n]
    source = weights(composite)
    assert any(k.startswith("model.visual.") for k in source)
    text = {f"model.language_model.{k}": v for k, v in model.get_decoder().state_dict().items()}
    assert text.keys() <= source.keys()
    for k, v in text.items():  # every text weight is the checkpoint's own
        assert torch.equal(v, source[k]), k


def test_export_puts_the_base_vision_tower_back_around_the_trained_text_model(composite, tmp_path):
    """A run whose sft stage trained the text model (here: every text weight moved, as training does, and saved as
    a stage saves its model): the export is the base's vision-language model with the trained text weights."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    run = tmp_path / "run"
    trained = models.load_causal_lm(composite, "amp-bf16", "full")
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)
    models.save_merged(trained, models.load_tokenizer(composite), run / "sft" / "model", torch.float32)
    assert json.loads((run / "sft" / "model" / "config.json").read_text())["model_type"] == "qwen3_5_text"
    cfg = load_config("configs/tiny-cpu.yaml", sets=[f"model.path={composite}"])
    (run / "config.resolved.json").write_text(json.dumps(resolved_dict(cfg)))
    (run / "manifest.json").write_text(json.dumps({
        "run": {"config": {"name": "composite"}, "base_model_path": str(composite), "git_commit": "test"},
        "stages": {"sft": {"output_model": str(run / "sft" / "model"), "result": {}, "plan": {}}}}))
    lines: list[str] = []
    info = export_stage(run, "sft", tmp_path / "out", "fp32", echo=lines.append)

    out = tmp_path / "out"
    assert "vision tower is copied untouched" in lines[1] and info["vision_tower"].startswith("copied untouched")
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3_5"
    assert (out / "preprocessor_config.json").read_text() == (composite / "preprocessor_config.json").read_text()
    source, exported = weights(composite), weights(out)
    assert exported.keys() == source.keys()
    vision = [k for k in source if k.startswith("model.visual.")]
    assert vision and all(torch.equal(exported[k], source[k]) for k in vision)
    text = {f"model.language_model.{k}": v for k, v in trained.get_decoder().state_dict().items()}
    assert all(torch.equal(exported[k], v) and not torch.equal(v, source[k]) for k, v in text.items())
    assert torch.equal(exported["lm_head.weight"], trained.get_output_embeddings().weight)
    assert type(AutoModelForImageTextToText.from_pretrained(out)).__name__ == "Qwen3_5ForConditionalGeneration"
    again = AutoModelForCausalLM.from_pretrained(out)  # and a later stage or run trains the same text model
    ids = torch.tensor([[5, 17, 42, 7, 99]])
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, trained(ids).logits)
