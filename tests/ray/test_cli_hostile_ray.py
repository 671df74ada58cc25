"""Issue 36's pipeline cases found once Ray is up, through the real `run` entry point on the shared session
cluster: a binary data file (every record quarantined) is one sentence naming the quarantine file, rc 2; and
`max_steps: 0` trains nothing, passes the stage's input on and says so."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from medgpt_ray.cli import main

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "tiny-cpu.yaml")
ONLY_SFT = [f"stages.{s}.enabled=false" for s in ("pt", "rm", "dpo", "eval")]


def run(tmp_path: Path, capsys, *sets: str) -> tuple[int, str]:
    argv = ["run", "--config", CONFIG, "--set", f"output_dir={tmp_path / 'runs'}"]
    for s in [*ONLY_SFT, *sets]:
        argv += ["--set", s]
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_a_binary_data_file_is_one_sentence_naming_its_quarantine_file(ray_cluster, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(bytes(range(256)) * 8 + b"\n" + bytes(range(255, -1, -1)) * 8 + b"\n")
    rc, out = run(tmp_path, capsys, f"data.sft=[{binary}]")
    quarantine = tmp_path / "runs" / "tiny-cpu" / "data" / "quarantine-sft.jsonl"
    assert rc == 2, out
    assert re.search(rf"config error: data.sft: none of the \d+ source records could be used: all quarantined, "
                     rf"each with its reason in {re.escape(str(quarantine))}\n", out), out
    assert "Traceback" not in out and quarantine.is_file()
    assert binary.read_bytes().startswith(bytes(range(256)))  # the input untouched


def test_max_steps_0_trains_nothing_and_says_it_passes_the_input_on(ray_cluster, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    rc, out = run(tmp_path, capsys, "stages.sft.max_steps=0", "stages.dpo.enabled=true", "stages.dpo.max_steps=0")
    assert rc == 0, out
    assert "[sft] max_steps 0: no training; its input, the base model, is passed on to the stages after it" in out
    summary = json.loads((tmp_path / "runs" / "tiny-cpu" / "summary.json").read_text())
    assert summary["stages"]["sft"]["status"] == "passed-on" and summary["stages"]["dpo"]["status"] == "passed-on"
    assert not (tmp_path / "runs" / "tiny-cpu" / "sft").exists()  # no step trained, no checkpoint, no model
    assert "Traceback" not in out
