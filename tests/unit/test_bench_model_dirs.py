"""The benches' random-weight models are written whole or not at all (bench/family_models.model_dir_written): on the
GPU machine a save cut short by a full disk left a config.json, and the next call took the half-written directory for
a model and failed on its missing tokenizer (bench/results/serve_slots_h100_failed/)."""

from __future__ import annotations

import pytest

from bench.family_models import model_dir_written


def test_a_save_cut_short_leaves_no_model_directory(tmp_path):
    out = tmp_path / "qwen2.5-1.5b-decodable"
    with pytest.raises(OSError, match="No space"), model_dir_written(out) as part:
        (part / "config.json").write_text("{}")
        raise OSError(28, "No space left on device")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_finished_save_replaces_the_directory_whole(tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "stale.safetensors").write_text("old")
    with model_dir_written(out) as part:
        (part / "config.json").write_text("{}")
        (part / "tokenizer.json").write_text("{}")
    assert sorted(f.name for f in out.iterdir()) == ["config.json", "tokenizer.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["m"]
