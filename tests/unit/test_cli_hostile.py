"""Issue 36's pipeline/CLI cases, each asserting the rc, the sentence, no traceback, and that nothing was lost or
overwritten: found before Ray starts (in-process, through the real entry point), or in the run's lock (another
process holds it). Ctrl-C in `clean` and a data file that gives no record (found once Ray is up) are in
tests/ray/test_cli_hostile_ray.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from medgpt_ray.cli import main
from medgpt_ray.config import ConfigError, load_config
from medgpt_ray.run.manifest import Manifest
from medgpt_ray.run.outcomes import RunSummary
from medgpt_ray.run.run_lock import LOCK_FILE, RunDirBusy, run_dir_lock

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "tiny-cpu.yaml")


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = int(e.code or 0)
    out = capsys.readouterr()
    return rc, out.out + out.err


def assert_refused(rc: int, out: str, sentence: str) -> None:
    assert rc == 2, out
    assert sentence in out, out
    assert "Traceback" not in out, out


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch):
    """Every case here is refused before Ray is started or joined."""
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    started = ray.is_initialized()
    yield
    assert ray.is_initialized() == started


def test_an_unwritable_output_dir_is_a_sentence(capsys):
    rc, out = run_cli(["run", "--config", CONFIG, "--set", "output_dir=/proc/nope"], capsys)
    assert_refused(rc, out, "output_dir: cannot write the run directory /proc/nope/tiny-cpu")
    assert out.count("\n") == 1


def test_an_empty_data_file_is_a_sentence_before_ray_starts(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    rc, out = run_cli(["run", "--config", CONFIG, "--set", f"output_dir={tmp_path / 'runs'}",
                       "--set", f"data.sft=[{empty}]"], capsys)
    assert_refused(rc, out, f"data.sft: {empty} is empty (0 bytes)")
    assert not (tmp_path / "runs").exists()  # nothing written


def test_malformed_yaml_names_file_line_and_column(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel:\n  path: tiny\n  foo: [1, 2\nstages: {}\n", encoding="utf-8")
    rc, out = run_cli(["run", "--config", str(bad)], capsys)
    assert_refused(rc, out, f"{bad}:5:7: invalid YAML: expected ',' or ']', but got ':'")
    assert "<unicode string>" not in out and out.count("\n") == 1


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from medgpt_ray.run.run_lock import run_dir_lock
    with run_dir_lock(Path(sys.argv[1]), echo=lambda _: None):
        print("held", flush=True)
        time.sleep(60)
""")


def test_a_second_run_of_the_same_name_is_refused_naming_the_holder(tmp_path, capsys):
    run_dir = tmp_path / "runs" / "tiny-cpu"
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text('{"stages": {"pt": {}}}')  # the first run's work
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        before = {p.name: p.read_bytes() for p in run_dir.iterdir()}  # with the holder's run.lock
        rc, out = run_cli(["run", "--config", CONFIG, "--set", f"output_dir={tmp_path / 'runs'}"], capsys)
        assert_refused(rc, out, f"is in use by another run (PID {holder.pid} on host {socket.gethostname()}")
        assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before  # nothing written, nothing lost
    finally:
        holder.kill()
        holder.wait()


def test_a_stale_lock_is_taken_over_and_said_and_a_clean_release_leaves_none(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a PID that was this host's and is gone
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_FILE).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    lines: list[str] = []
    with run_dir_lock(run_dir, lines.append):
        held = json.loads((run_dir / LOCK_FILE).read_text())
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
        with pytest.raises(RunDirBusy, match=f"PID {os.getpid()} on host"):  # flock: per open file, so refused
            with run_dir_lock(run_dir, lines.append):
                pass
    assert lines == [f"medgpt-ray: took over the stale lock of {run_dir} left by PID {dead.pid} on host "
                     f"{socket.gethostname()} (that process is gone); that run was cut short: finished stages and "
                     "checkpoints are kept"]
    assert (run_dir / LOCK_FILE).read_text() == ""  # released: the next run has nothing to call stale
    with run_dir_lock(run_dir, lines.append):
        pass
    assert len(lines) == 1


def test_max_steps_0_passes_the_stages_input_on(tmp_path):
    """`max_steps: 0` is "no training" (bench/rl_stage_run.py --train-steps 0): the stage does not run and its
    dependants start from its input, as from a disabled stage's; a stage that needs its output is refused."""
    cfg = load_config(CONFIG, ["stages.sft.max_steps=0"])
    assert cfg.passes_on("sft") and "sft" not in cfg.enabled_stages()
    assert cfg.start_of("dpo") == "pt" and cfg.start_of("rm") == "pt"
    summary = RunSummary(cfg, tmp_path, Manifest(tmp_path / "manifest.json"), print)
    assert summary.final({})["sft"].status == "passed-on"
    assert not load_config(CONFIG).passes_on("sft") and not load_config(CONFIG, ["stages.eval.max_steps=0"]
                                                                        ).passes_on("eval")  # eval trains nothing
    rl = str(REPO / "configs" / "tiny-cpu-rl.yaml")
    with pytest.raises(ConfigError, match=r"stages.rloo.needs: stage 'rm' trains nothing \(max_steps: 0\)"):
        load_config(rl, ["stages.rm.max_steps=0", "stages.rloo.enabled=true"])


def test_both_entry_points_say_what_run_does_and_name_more_than_four_stages(capsys):
    """Issue 48 item 10: `--help` said "(pt -> sft -> rm, dpo)" where a run has eleven kinds of stage."""
    from medgpt_ray.cli.run import RUN_HELP

    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    job = subprocess.run([sys.executable, str(REPO / "jobs" / "pipeline.py"), "--help"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    for text in (listed, job):
        assert "pt -> sft -> rm, dpo" not in text
        assert " ".join(RUN_HELP.split()[:6]) in " ".join(text.split()) and "grpo" in text
