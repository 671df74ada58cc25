"""Every command given a bad input answers with one line on stderr and rc 2 — never a traceback (issue 16's
"Messages"). In-process through the real entry point: an exception would fail the test by itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medgpt_ray.cli import main

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "tiny-cpu.yaml")
ESTIMATE = ["estimate", "--stage", "sft", "--method", "lora", "--precision", "bf16", "--micro-batch", "1",
            "--seq-len", "128", "--no-grad-ckpt", "--no-fused-ce"]


def run_cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own exit
        return int(e.code or 0)


def model_dir(tmp_path: Path, name: str, config: object) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


def bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)))
    shape = {"vocab_size": 10, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 0,
             "intermediate_size": 128}
    return {
        "negative GPU budget": (["plan", "--config", CONFIG, "--gpu-mem-gib", "-5"], "not a positive number"),
        "LoRA rank 0": ([*ESTIMATE, "--model", "tiny", "--lora-rank", "0"], "not a positive integer"),
        "LoRA rank -5": ([*ESTIMATE, "--model", "tiny", "--lora-rank", "-5"], "not a positive integer"),
        "broken --set YAML": (["plan", "--config", CONFIG, "--set", "stages.sft.lr=[1,"], "not valid YAML"),
        "binary --config": (["plan", "--config", str(binary)], "not a UTF-8 text file"),
        "config.json a list": ([*ESTIMATE, "--model", model_dir(tmp_path, "list", [1, 2])], "not a JSON object"),
        "zero heads": ([*ESTIMATE, "--model", model_dir(tmp_path, "zero", shape)], "num_attention_heads is 0"),
        "binary topology": (["topo", "--topology-file", str(binary)], "not a text file"),
        "--explain -1": (["clean", "x", "--out", str(tmp_path / "o"), "--explain", "-1"], "integer >= 0"),
        "--num-cpus 0": (["run", "--config", CONFIG, "--num-cpus", "0"], "not a positive integer"),
        # Checked before Ray starts (a Ray Train worker group that cannot be placed retries forever):
        "8 workers on 2 CPUs": (["run", "--config", CONFIG, "--num-cpus", "2", "--set", "resources.num_workers=8"],
                                "resources.num_workers: stage pt needs 8 worker(s) x 1 CPU"),
        "missing data.sft file": (["run", "--config", CONFIG, "--set", f"data.sft=[{tmp_path / 'gone.jsonl'}]"],
                                  "data.sft:"),
        "model path without config.json": (["run", "--config", CONFIG, "--set", f"model.path={tmp_path}"],
                                           "not a local Hugging Face checkpoint directory"),
        "greedy samples": (["generate", "--model", str(tmp_path), "--input", "x.jsonl", "--out", str(tmp_path / "g"),
                            "--num-samples", "3"], "greedy decoding gives every sample the same answer"),
        "generate from no model": (["generate", "--model", str(tmp_path), "--input", "x.jsonl", "--out",
                                    str(tmp_path / "g")], "neither a model directory"),
    }


@pytest.mark.parametrize("case", ["negative GPU budget", "LoRA rank 0", "LoRA rank -5", "broken --set YAML",
                                  "binary --config", "config.json a list", "zero heads", "binary topology",
                                  "--explain -1", "--num-cpus 0", "8 workers on 2 CPUs", "missing data.sft file",
                                  "model path without config.json", "greedy samples", "generate from no model"])
def test_bad_input_is_one_line_and_rc_2(case, tmp_path, capsys, monkeypatch):
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    started = ray.is_initialized()
    argv, expected = bad_inputs(tmp_path)[case]
    rc = run_cli(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and expected in err, err
    assert ray.is_initialized() == started  # refused before any Ray cluster was started or joined
