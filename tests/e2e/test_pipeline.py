"""The whole tiny pipeline as a user runs it: `python jobs/pipeline.py` interrupted mid-SFT (a worker lost, then
Ctrl-C), the same config from another driver (resumes SFT, retraining the steps the lost worker had logged to the
same losses, then the rest), a re-run that skips everything, and `ray start --head` + `ray job submit`."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from medgpt_ray.data.shards import read_records
from medgpt_ray.stages.callbacks import PAUSE_AT_STEP_ENV
from tests.ray.test_formats_pipeline import assert_formats_prepared, formats_data_sets
from tests.ray_startup import free_port, ray_temp_root

pytestmark = pytest.mark.e2e

# Few steps per stage: this checks wiring, the demo checks learning.
FAST = [
    "--set", "stages.pt.max_steps=2", "--set", "stages.rm.max_steps=2", "--set", "stages.dpo.max_steps=2",
    "--set", "data.max_records=48", "--set", "progress_every=1",
]


def pipeline_cmd(repo: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(repo / "jobs" / "pipeline.py"), "--config", str(repo / "configs" / "tiny-cpu.yaml"),
            "--set", f"output_dir={out}", "--num-cpus", "2", *FAST, *extra]


# Both tests stop a run at step 6, after checkpoint-4 (the resume test's worker, the job test's driver): 8 steps leave
# the resumed run steps 5-8 to train.
SFT_STEPS = 8
JOB_SFT_STEPS = 8


def metrics_rows(stage_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (stage_dir / "metrics.jsonl").read_text().splitlines()]


def logged_steps(stage_dir: Path) -> list[int]:
    return [r["step"] for r in metrics_rows(stage_dir) if "loss" in r]


def logged_losses(stage_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics_rows(stage_dir) if "loss" in r}


RAY = str(Path(sys.executable).parent / "ray")  # this venv's Ray CLI
_RAY_TMP = ray_temp_root()  # the local clusters `jobs/pipeline.py` starts live here, not in another's /tmp/ray


@pytest.fixture(autouse=True, scope="module")
def _remove_ray_tmp():
    yield
    shutil.rmtree(_RAY_TMP, ignore_errors=True)


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.pop("RAY_ADDRESS", None)
    e["RAY_AUTH_MODE"] = "disabled"
    e["RAY_TMPDIR"] = str(_RAY_TMP)
    return e


def run(cmd: list[str], timeout: int = 600, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=kw.pop("env", env()), **kw)
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p


def summary(out: Path) -> dict:
    return json.loads((out / "tiny-cpu" / "summary.json").read_text())


def in_process(repo: Path, out: Path, *sets: str) -> tuple[dict, list[str]]:
    """The same config as `pipeline_cmd`, run by this process's Pipeline on the shared session cluster."""
    from medgpt_ray.config import load_config
    from medgpt_ray.run.pipeline import Pipeline, RunOptions

    args = [*FAST, *sets, "--set", f"output_dir={out}"]
    cfg = load_config(str(repo / "configs" / "tiny-cpu.yaml"), [a for a in args if a != "--set"])
    lines: list[str] = []
    return Pipeline(cfg, RunOptions(echo=lines.append)).run(), lines


def kill_when_paused(marker: Path, killed: list[int], losses: dict[int, float],
                     timeout_s: float = 300.0) -> threading.Thread:
    """SIGKILL the training worker whose pid the pause hook writes to `marker` once its step is logged; `losses`
    gets the steps the stage had logged then (read while the worker waits in the hook: nothing rewrites them yet)."""

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if marker.exists():
            pid = int(marker.read_text())
            if pid != os.getpid():  # a Ray worker's process, never this one
                losses.update(logged_losses(marker.parent))
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    t = threading.Thread(target=watch, name="kill-worker", daemon=True)
    t.start()
    return t


def interrupted_after_a_worker_died(repo: Path, out: Path, sft: list[str]
                                    ) -> tuple[str, list[int], dict[int, float]]:
    """`jobs/pipeline.py` as a user runs it (its own local Ray cluster) loses an sft training worker once step 6 is
    logged (SIGKILLed, as the host's OOM killer would; checkpoint-4 is on disk); the driver says it restarts the
    stage from checkpoint-4, and the user hits Ctrl-C right then. Returns the run's output, the killed pid and the
    losses sft had logged when the worker was killed."""
    killed: list[int] = []
    losses: dict[int, float] = {}
    watcher = kill_when_paused(out / "tiny-cpu" / "sft" / ".paused_worker", killed, losses)
    proc = subprocess.Popen(pipeline_cmd(repo, out, *sft), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**env(), PAUSE_AT_STEP_ENV: "6"}, cwd=repo, start_new_session=True)
    lines: list[str] = []
    restarting_or_ended = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if "[sft] worker died" in line:
                restarting_or_ended.set()
        restarting_or_ended.set()

    reader = threading.Thread(target=read, name="pipeline-output", daemon=True)
    reader.start()
    try:
        assert restarting_or_ended.wait(timeout=400), f"no worker restart within 400 s:\n{''.join(lines)[-4000:]}"
        assert proc.poll() is None, f"pipeline ended before its sft worker died:\n{''.join(lines)[-4000:]}"
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as a user would: the driver shuts its local Ray cluster down
        proc.wait(timeout=120)
        reader.join(timeout=10)
        watcher.join(timeout=1)
    return "".join(lines), killed, losses


def test_pipeline_skips_finished_stages_and_resumes_an_interrupted_one(repo, tmp_path, ray_cluster, monkeypatch):
    # Over 60 s (1.5-3 min on 2 cores, by load), on purpose: `jobs/pipeline.py` as a user runs it, with a local Ray
    # cluster of its own, loses a worker and is interrupted by Ctrl-C while it restarts the stage (a resume after an
    # interrupted *driver* needs a driver of its own); then, in this process on the shared session cluster, the
    # resuming run (all stages, eval included) and the all-skipped re-run. The resumed sft retrains steps 5 and 6,
    # which the interrupted run had logged: the reference for "resumed trains exactly as before", without a third
    # sft run (an uninterrupted --only-stage sft run was the reference here: one Ray Train start-up more, ~30-50 s).
    monkeypatch.chdir(repo)  # the config's relative data paths, as for the `jobs/pipeline.py` run (cwd=repo)
    out = tmp_path / "runs"
    sft = ["--set", f"stages.sft.max_steps={SFT_STEPS}", "--set", "stages.sft.save_steps=4",
           "--set", "stages.sft.logging_steps=1",
           # pt is off here: skipping a finished pt after a killed driver is the job test's; sft starts from the base.
           "--set", "stages.pt.enabled=false",
           # One worker each: rm and dpo (both from sft) fit the 2 CPUs side by side, as a wave of the stage graph.
           "--set", "stages.rm.num_workers=1", "--set", "stages.dpo.num_workers=1",
           # The eval stage's wiring, not its statistics (tests/stages/test_eval_stage.py): 8 answers of 16 tokens.
           "--set", "stages.eval.max_prompts=8", "--set", "stages.eval.max_new_tokens=16"]
    first_log, killed, killed_losses = interrupted_after_a_worker_died(repo, out, sft)
    assert len(killed) == 1, f"the sft worker never paused at step 6:\n{first_log[-3000:]}"
    # The pipeline restarts a stage whose worker died by itself, from its newest checkpoint (the restarted attempt
    # training to the end in the same driver: tests/ray/test_memory_plan.py's OOM back-off, the same attempt loop).
    assert re.search(rf"\[sft\] worker died \(rank 0, pid {killed[0]}\): restarting from checkpoint-4 "
                     r"\(restart 1 of 2\)", first_log), first_log[-3000:]
    manifest_file = out / "tiny-cpu" / "manifest.json"
    manifest = json.loads(manifest_file.read_text()) if manifest_file.is_file() else {"stages": {}}
    assert "sft" not in manifest["stages"], "an interrupted stage must not be in the manifest"
    # Ctrl-C is a sentence, not a traceback, and summary.json says what this run did (issue 16 item 8).
    assert "interrupted: finished stages and the last checkpoint are kept" in first_log
    assert "KeyboardInterrupt" not in first_log
    assert "FAILED" not in first_log  # the stage's Ray work going down with the driver is not a stage failure
    cut = summary(out)["stages"]
    assert cut["pt"]["status"] == "disabled" and cut["sft"]["status"] == "interrupted"

    # The same config from another driver resumes sft from checkpoint-4 (the fingerprints do not depend on which
    # driver or cluster ran a stage), then runs rm and dpo side by side, then the eval stage.
    _, lines = in_process(repo, out, *sft)
    assert_resumed_and_finished(out, "\n".join(lines))
    assert any(line.startswith("[sft] resumed from checkpoint-4") for line in lines), lines  # said in the terminal
    sft_result = json.loads((out / "tiny-cpu" / "sft" / "result.json").read_text())
    ev = summary(out)["eval"]

    # The resumed attempt trained exactly as the interrupted one (data order, optimizer and scheduler state restored
    # from checkpoint-4): the steps the killed worker had logged after it, retrained, have the same loss within 1e-6,
    # and the steps before it are kept as they were.
    resumed = logged_losses(out / "tiny-cpu" / "sft")
    assert sorted(k for k in killed_losses if k > 4) == [5, 6], killed_losses
    assert resumed == pytest.approx({**resumed, **killed_losses}, abs=1e-6)

    # Again: everything is done.
    third, lines = in_process(repo, out, *sft)
    for stage in ("sft", "rm", "dpo", "eval"):
        assert any(line.startswith(f"[{stage:>3}] done in manifest") for line in lines), stage
    assert [third["stages"][k]["status"] for k in ("pt", "sft", "rm", "dpo")] == ["disabled"] + ["skipped"] * 3
    assert [summary(out)["stages"][k]["status"] for k in ("sft", "rm", "dpo", "eval")] == ["skipped"] * 4
    assert summary(out)["eval"] == ev  # a skipped eval stage keeps its numbers in the summary
    assert json.loads((out / "tiny-cpu" / "sft" / "result.json").read_text()) == sft_result  # nothing retrained


def assert_resumed_and_finished(out: Path, second: str) -> None:
    """The resuming run's outputs: sft resumed and trained each step once, rm and dpo side by side, eval last."""
    sft_result = json.loads((out / "tiny-cpu" / "sft" / "result.json").read_text())
    assert sft_result["resumed_from"] is not None and sft_result["resumed_from"].endswith("checkpoint-4")
    assert sft_result["steps"] == SFT_STEPS
    assert logged_steps(out / "tiny-cpu" / "sft") == list(range(1, SFT_STEPS + 1))  # each step once
    s = summary(out)
    assert [s["stages"][k]["status"] for k in ("pt", "sft", "rm", "dpo")] == ["disabled", "done", "done", "done"]
    assert Path(s["stages"]["dpo"]["output_model"], "config.json").is_file()
    assert "running rm and dpo side by side" in second
    # The eval stage (configs/tiny-cpu.yaml enables it) ran last, as one Ray task: dpo against sft, judged by rm.
    assert s["stages"]["eval"]["status"] == "done"
    ev = s["eval"]
    assert ev["reference"] == "sft" and set(ev["models"]) == {"sft", "dpo"} and ev["judge"] == "rm"
    assert 0 < ev["data"]["prompts"] <= 8 and ev["data"]["exam_questions"] == 52
    assert ev["win_rates"]["dpo"]["ci95"][0] <= ev["win_rates"]["dpo"]["win_rate"] <= ev["win_rates"]["dpo"]["ci95"][1]
    assert re.search(r"^win rate dpo over sft: [0-9.]+ \[[0-9.]+, [0-9.]+\] 95% CI", second, re.M), second[-3000:]
    assert "[eval] start: one Ray task on CPU, reading rm, dpo and the reference model " in second
    for stage, workers in (("sft", 2), ("rm", 1), ("dpo", 1)):
        plan = json.loads((out / "tiny-cpu" / stage / "plan.json").read_text())
        assert plan["num_workers"] == workers
        assert (out / "tiny-cpu" / stage / "metrics.jsonl").is_file()
    assert "summary of run 'tiny-cpu'" in second
    # The run's last line names its report (`make demo` ends with it).
    assert f"report: {out.resolve() / 'tiny-cpu' / 'report.html'} (open it in a browser)" in second.splitlines()[-4:]
    assert (out / "tiny-cpu" / "sft" / "tb").is_dir()
    manifest = json.loads((out / "tiny-cpu" / "manifest.json").read_text())
    assert [w["rank"] for w in manifest["stages"]["sft"]["workers"]] == [0, 1]
    assert manifest["run"]["packages"]["ray"] == "2.60.0"


def test_only_stage_without_upstream_fails_clearly(repo, tmp_path):
    p = subprocess.run(pipeline_cmd(repo, tmp_path / "runs", "--only-stage", "dpo"), capture_output=True,
                       text=True, timeout=300, env=env())
    assert p.returncode != 0
    assert "stage dpo starts from the output of stage sft" in p.stderr


def _kill_driver(out: Path) -> list[int]:
    """SIGKILL the job's driver: the `jobs/pipeline.py` process writing to `out` (unique to this test), not the
    shell the job supervisor may have started it under."""
    killed = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (proc.name.isdigit() and any(a.endswith(b"jobs/pipeline.py") for a in argv[:2])
                and f"output_dir={out}".encode() in argv):
            os.kill(int(proc.name), signal.SIGKILL)
            killed.append(int(proc.name))
    return killed


@contextmanager
def token_auth_head(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """`ray start --head` (token auth on, as by default) on free ports under a temp dir of its own, up and answering
    `ray job list`; yields its dashboard address and the environment of a client holding the token. Stopped after."""
    token = tmp_path / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    e = env()
    e.update(PATH=f"{Path(RAY).parent}:{e['PATH']}", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    gcs, dash = free_port(), free_port()
    # Short: Ray's unix sockets live under the temp dir and AF_UNIX paths stop at 107 bytes.
    ray_tmp = ray_temp_root()
    head_log = (tmp_path / "head.log").open("w")
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--num-cpus", "2", "--port", str(gcs),
         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--disable-usage-stats",
         # The agents' ports are the kernel's picks (0, bound by each agent and published to the GCS): another
         # cluster on this machine may hold the agent's default 52365 (without its HTTP server no job is
         # accepted), and a free_port() released here may be taken before the agent binds it (the agent dies).
         "--dashboard-agent-listen-port", "0", "--temp-dir", str(ray_tmp)],
        stdout=head_log, stderr=subprocess.STDOUT, env=e, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 120
        while subprocess.run([RAY, "job", "list", "--address", address], capture_output=True,
                             env=e, timeout=60).returncode != 0:
            log = (tmp_path / "head.log").read_text()[-3000:]
            assert head.poll() is None, f"ray start exited:\n{log}"
            assert time.monotonic() < deadline, f"Ray head did not come up:\n{log}"
            time.sleep(0.5)
        yield address, e
    finally:
        os.killpg(head.pid, signal.SIGINT)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        head_log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def submit_job(repo: Path, address: str, e: dict[str, str], out: Path, job_id: str,
               *flags: str) -> subprocess.CompletedProcess:
    """`ray job submit --working-dir <repo> -- python jobs/pipeline.py ...` of the job test's config."""
    cmd = [RAY, "job", "submit", "--address", address, "--submission-id", job_id, *flags,
           "--working-dir", str(repo), "--", "python", "jobs/pipeline.py", "--config",
           "configs/tiny-cpu.yaml", "--set", f"output_dir={out}", *FAST,
           "--set", f"stages.sft.max_steps={JOB_SFT_STEPS}", "--set", "stages.sft.save_steps=4",
           "--set", "stages.sft.logging_steps=1",
           "--set", "stages.rm.enabled=false", "--set", "stages.dpo.enabled=false",
           "--set", "stages.eval.enabled=false",  # the resume test above runs it
           # MedicalGPT's own formats as a user brings them, one file per format (plain-text pretraining
           # lines, ShareGPT with tool calls, its DPO and GRPO files), every record of them.
           *formats_data_sets()]
    # `ray job list` answers before the head's job agent is up; submission then gets a 500 "No available
    # agent": retry that (and only that) for a while.
    agent_deadline = time.monotonic() + 300
    while True:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=e, cwd=repo)
        if p.returncode == 0 or "No available agent" not in p.stdout + p.stderr:
            break
        if time.monotonic() > agent_deadline:
            break
        time.sleep(1)
    assert p.returncode == 0, f"job submit failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p


def test_ray_job_submit_with_token_auth_resumes_after_the_driver_is_killed(repo, tmp_path):
    """The path users take: `ray start --head` with token auth, then `ray job submit` from the project root. The
    first job's driver is SIGKILLed mid-SFT (its machine lost, `kill -9`); the same job submitted again skips pt,
    resumes SFT from its checkpoint and trains the same steps the killed driver's run trained (loss within 1e-6)."""
    # Over 60 s (1.5-3 min on 2 cores, by load), on purpose: a `ray start --head` cluster of its own and two jobs
    # via `ray job submit`. The jobs train pt -> sft: every stage's workers import the shipped working-dir copy,
    # and sft starts from pt's output; rm and dpo, the same runner from sft's output, run in the resume test above.
    out = tmp_path / "runs"
    sft_dir = out / "tiny-cpu" / "sft"
    with token_auth_head(tmp_path) as (address, e):
        no_token = subprocess.run([RAY, "job", "list", "--address", address], capture_output=True,
                                  text=True, env={**e, "RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")},
                                  timeout=60)
        assert no_token.returncode != 0, "the cluster accepted a client without its token"

        # The first job's rank 0 stops once step 6 is logged (between checkpoint-4 and the next; the other rank
        # waits in its next collective) and its driver is killed there: the resumed job retrains steps 5 and 6,
        # which the killed one logged, from checkpoint-4.
        submit_job(repo, address, e, out, "medgpt-e2e-killed", "--no-wait", "--runtime-env-json",
                   json.dumps({"env_vars": {PAUSE_AT_STEP_ENV: "6"}}))
        deadline = time.monotonic() + 300
        while not (sft_dir / ".paused_worker").is_file():
            if time.monotonic() > deadline:
                logs = run([RAY, "job", "logs", "--address", address, "medgpt-e2e-killed"], env=e).stdout
                pytest.fail(f"SFT did not reach step 6 within 300 s:\n{logs[-3000:]}")
            time.sleep(0.1)
        assert _kill_driver(out), "the job's driver process was not found"
        killed_losses = logged_losses(sft_dir)
        cut = summary(out)["stages"]  # rewritten after every wave: pt finished, sft not
        assert cut["pt"]["status"] == "done" and cut["sft"]["status"] == "pending"
        assert "sft" not in json.loads((out / "tiny-cpu" / "manifest.json").read_text())["stages"]

        # `ray job submit` follows the job's log to its end, as users see it.
        logs = submit_job(repo, address, e, out, "medgpt-e2e").stdout
    assert "on cluster Ray" in logs
    assert "[ pt] done in manifest" in logs and f"[sft] step {JOB_SFT_STEPS}/{JOB_SFT_STEPS}" in logs
    assert "summary of run 'tiny-cpu'" in logs
    statuses = [summary(out)["stages"][k]["status"] for k in ("pt", "sft", "rm", "dpo")]
    assert statuses == ["skipped", "done", "disabled", "disabled"]
    sft_result = json.loads((sft_dir / "result.json").read_text())
    assert sft_result["resumed_from"].endswith("checkpoint-4") and sft_result["steps"] == JOB_SFT_STEPS
    assert logged_steps(sft_dir) == list(range(1, JOB_SFT_STEPS + 1))  # the killed job's later steps not twice
    again = {k: v for k, v in killed_losses.items() if k > 4}
    assert sorted(again) == [5, 6]
    assert {k: logged_losses(sft_dir)[k] for k in again} == pytest.approx(again, abs=1e-6)
    assert json.loads((sft_dir / "plan.json").read_text())["num_workers"] == 2
    data = out / "tiny-cpu" / "data"
    pairs = read_records(data / "preference.train.parquet")
    assert pairs and all(p["conversations"][-1]["role"] in ("user", "tool") for p in pairs)
    # The resumed job prepared every kind again (a stage ran): its own lines say what it read.
    assert_formats_prepared(data, logs.splitlines())
