"""`medgpt-ray clean` as a user runs it, on one file per MedicalGPT source format (data/sample/formats):
every file read, the report adds up, only the records made malformed on purpose are quarantined, the terminal
holds our lines and not Ray's, and `--explain` shows redacted records but never an unparseable line's text."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from medgpt_ray.run.native_logs import NATIVE_LINE
from tests.ray_startup import ray_temp_root

pytestmark = pytest.mark.e2e

FORMATS = Path(__file__).resolve().parents[2] / "data" / "sample" / "formats"


def malformed_lines() -> dict[str, dict[int, str]]:
    """The generator's own list of the lines it broke on purpose (the JSON block of formats/README.md)."""
    text = (FORMATS / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```json\n(.*?)```", text, re.S).group(1)
    return {name: {int(k): v for k, v in entry["malformed"].items()} for name, entry in json.loads(block).items()}


def interrupt_at(cmd: list[str], env: dict[str, str], line_start: str) -> subprocess.CompletedProcess:
    """Run `cmd` and Ctrl-C it (SIGINT to its process group, as a terminal does) once it prints `line_start`."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(line_start):
            os.killpg(proc.pid, signal.SIGINT)
            break
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(seen) + out, err)


@pytest.fixture(scope="module")
def interrupted_then_cleaned(tmp_path_factory):
    """A clean cut by Ctrl-C while it reads the chunks, then the same command again into the same --out."""
    out = tmp_path_factory.mktemp("clean") / "out"
    ray_tmp = ray_temp_root()
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    cmd = [str(Path(sys.executable).parent / "medgpt-ray"), "clean", str(FORMATS), "--out", str(out),
           "--num-cpus", "2", "--explain", "2"]
    try:
        cut = interrupt_at(cmd, env, "[clean] 1/3 reading and cleaning")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert p.returncode == 0, f"clean failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return out, cut, p


@pytest.fixture(scope="module")
def cleaned(interrupted_then_cleaned):
    out, _, p = interrupted_then_cleaned
    return out, p


def quarantine_rows(out: Path) -> list[dict]:
    return [json.loads(line) for part in sorted((out / "quarantine").glob("part-*.jsonl"))
            for line in part.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_every_format_is_read_and_the_report_adds_up(cleaned):
    out, _ = cleaned
    report = json.loads((out / "report.json").read_text())
    expected = malformed_lines()
    assert sorted(Path(f).name for f in report["files"]) == sorted(expected)
    assert report["adds_up"]
    assert set(report["per_kind"]) == {"pretrain", "sft", "preference", "prompt", "unpaired"}
    for kind in ("pretrain", "sft", "preference", "prompt", "unpaired"):
        assert report["per_kind"][kind]["emitted"] > 0
        assert list((out / "data" / kind).glob("part-*.parquet"))


def test_only_the_records_broken_on_purpose_are_quarantined(cleaned):
    out, _ = cleaned
    expected = malformed_lines()
    by_file: dict[str, dict[int, dict]] = {}
    for row in quarantine_rows(out):
        by_file.setdefault(Path(row["source_file"]).name, {})[row["source_line"]] = row
    for name, broken in expected.items():
        got = {line: row for line, row in by_file.get(name, {}).items() if row["dropped_by"] == "reader"}
        assert sorted(got) == sorted(broken), name
        for line, reason in broken.items():
            assert reason in got[line]["reason"], (name, line)
    # A valid tool-call conversation is never dropped by quality or dedup either.
    tools_file = by_file.get("sft_sharegpt_tools.jsonl", {})
    assert {line for line, row in tools_file.items() if row["dropped_by"] != "reader"} == set()


def test_tool_calls_and_tools_survive_cleaning(cleaned):
    import pyarrow.parquet as pq

    out, _ = cleaned
    table = pq.read_table(out / "data" / "sft")
    rows = [r for r in table.to_pylist() if r["tools"]]
    assert rows, "no cleaned sft record kept its tools"
    for r in rows:
        assert all(isinstance(t, dict) and t.get("name") for t in json.loads(r["tools"]))
    calls = [json.loads(t["content"]) for r in table.to_pylist() for t in r["conversations"]
             if t["role"] == "tool_call"]
    assert calls and all(c.get("name") for call in calls for c in (call if isinstance(call, list) else [call]))
    assert any(t["role"] == "tool" for r in table.to_pylist() for t in r["conversations"])
    # The deliberately fake phone number of the samples is redacted in the cleaned output.
    text = json.dumps(table.to_pylist(), ensure_ascii=False)
    assert "13800138000" not in text


def test_the_terminal_holds_our_lines_not_rays(cleaned):
    out, p = cleaned
    terminal = p.stdout + p.stderr
    assert "logging_progress" not in terminal and "\tINFO " not in terminal
    # Ray's native lines (core worker, raylet; at exit too) and "the Dataset job will hang" (issue 36 item 5).
    assert not NATIVE_LINE.search(terminal.encode()) and "Dataset job will hang" not in terminal, terminal
    assert "cleaned " in p.stdout and "adds up" in p.stdout
    log = (out / "clean.log").read_text(encoding="utf-8")
    assert "ray.data" in log  # Ray Data's own lines went to the log file instead


def test_explain_shows_redacted_records_and_never_an_unparseable_line(cleaned):
    out, p = cleaned
    assert "[explain] reader:invalid JSON" in p.stdout
    assert "unparseable line" in p.stdout
    for row in quarantine_rows(out):
        if row["raw"]:
            assert row["raw"].strip() not in p.stdout
    assert "13800138000" not in p.stdout


def test_ctrl_c_is_one_sentence_and_the_rerun_says_it_starts_over(interrupted_then_cleaned):
    """Issue 36 item 4: rc 130, one sentence, no traceback, no partial output; the next run says it starts over
    (the cleaner does not resume part-way) and leaves no mark of the interrupted one."""
    out, cut, p = interrupted_then_cleaned
    assert cut.returncode == 130, cut.stdout[-2000:] + cut.stderr[-2000:]
    assert "Traceback" not in cut.stdout + cut.stderr and "KeyboardInterrupt" not in cut.stdout + cut.stderr
    assert cut.stderr.strip().startswith(f"interrupted: the cleaning into {out} stopped before its end")
    assert cut.stderr.count("\n") == 1, cut.stderr
    assert f"[clean] the last run into {out} was interrupted: starting over from the first chunk" in p.stdout
    assert not (out / ".medgpt-clean-interrupted").exists()
