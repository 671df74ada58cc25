"""The run report (issue 20) and TensorBoard event files, on the shared tiny run (tests/ray/conftest.py: sft
only, 12 steps, a step logged each) and the run that cleans raw sources first: the report.html the pipeline
wrote, opened in a real headless Chromium; no record text in it; the event files read back with TensorBoard's
own reader."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from tests.browser import headless_chromium

pytestmark = pytest.mark.ray

# Every section a run with one trained stage (sft) and no cleaning step or sweep has: each "not run" piece
# still has its section, with a note.
TINY_SECTIONS = ("run", "stage-graph", "data", "data-prepared", "data-overlong", "cleaning", "sweep", "stage-sft",
                 "plan-sft", "curves-sft", "speed-sft", "gpu-sft", "eval-sft")


def record_strings(path: Path) -> set[str]:
    """Every text value of a JSONL data file's records (roles and field names left out): what must not leak."""
    out: set[str] = set()

    def walk(value: object, key: str = "") -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif isinstance(value, str) and key not in ("from", "role") and len(value.strip()) >= 12:
            out.add(value.strip())

    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            walk(json.loads(line))
        except ValueError:
            out.add(line.strip())  # an unparseable line: the raw text itself
    return out


def assert_no_record_text(page: str, data_file: Path) -> None:
    text = html.unescape(page)
    strings = record_strings(data_file)
    assert len(strings) >= 10, data_file
    leaked = [s[:40] for s in strings if s in text or s[:16] in text]
    assert not leaked, f"record text in the report: {leaked[:3]}"


def test_the_pipeline_writes_a_report_that_a_browser_shows_whole(tiny_run):
    report = tiny_run.run_dir / "report.html"
    assert report.is_file()
    assert f"report: {report} (open it in a browser)" in tiny_run.lines[-3:], tiny_run.lines[-3:]
    page = report.read_text(encoding="utf-8")
    assert "http://" not in page and "https://" not in page  # self-contained: nothing to fetch
    with headless_chromium() as browser:
        browser.get(report.as_uri())
        ids = set(browser.execute_script("return Array.from(document.querySelectorAll('section')).map(s => s.id)"))
        assert set(TINY_SECTIONS) <= ids, f"missing sections: {set(TINY_SECTIONS) - ids}"
        images = browser.execute_script(
            "return Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])")
        # stage graph, records per kind, sft's memory plan, loss and learning rate, throughput (a CPU run draws no
        # GPU memory: a note says so)
        assert len(images) >= 5, images
        assert all(complete and w > 0 and h > 0 for _, complete, w, h in images), images
        gpu = browser.execute_script("return document.getElementById('gpu-sft').innerText")
        assert "CPU run" in gpu
        plan = browser.execute_script("return document.getElementById('plan-sft').innerText")
        # The device it ran on beside the planning target (issue 36); this CPU run was planned for a GPU budget
        # (resources.gpu_memory_gib), which its budget cell shows (a CPU run without one: tests/unit/test_report.py).
        assert "x CPU (1 host)" in plan and "planned for (speed model)" in plan
        assert f"budget GiB\t{tiny_run.budget_gib:g}" in plan
        sweep = browser.execute_script("return document.getElementById('sweep').innerText")
        assert "not run" in sweep
        curves = {alt for alt, *_ in images}
        assert {"sft loss", "sft speed", "sft memory plan", "stage graph"} <= curves


def test_the_report_quotes_no_record_text(tiny_run, repo):
    page = (tiny_run.run_dir / "report.html").read_text(encoding="utf-8")
    assert_no_record_text(page, repo / "data/sample/sft_sharegpt.jsonl")
    # ...but counts: the prepared sft data, as the pipeline printed them.
    prepared = json.loads((tiny_run.run_dir / "data" / "prepared.json").read_text())
    assert prepared["sft"]["train_records"] > 0
    assert f">{prepared['sft']['train_records']}<" in page


def test_records_longer_than_seq_len_are_counted_in_the_terminal_summary_and_report(tiny_run):
    """Issue 36: most of tiny_run's conversations are longer than its sft seq_len of 256 (the tiny tokenizer reads
    about a character a token): the done line, a warning line, summary.json and the report's data section count
    them, never silently."""
    over = json.loads((tiny_run.run_dir / "summary.json").read_text())["stages"]["sft"]["overlong"]
    prepared = json.loads((tiny_run.run_dir / "data" / "prepared.json").read_text())
    assert over["records"] == prepared["sft"]["train_records"] and over["seq_len"] == 256
    assert over["truncated"] > 0.05 * over["records"] and over["keep_99_seq_len"] > 256 and over["policy"] == "truncate"
    done = next(line for line in tiny_run.lines if line.startswith("[sft] done in"))
    assert (f"{over['truncated']:,} truncated, {over['skipped']:,} skipped of {over['records']:,} conversations over "
            f"seq_len 256") in done
    warning = [line for line in tiny_run.lines if line.startswith("[sft] warning:")]
    assert len(warning) == 1 and f"seq_len {over['keep_99_seq_len']:,} would keep 99 %" in warning[0]
    page = (tiny_run.run_dir / "report.html").read_text(encoding="utf-8")
    section = page.split('id="data-overlong"', 1)[1].split("</section>", 1)[0]
    assert all(f">{over[k]}<" in section for k in ("records", "truncated", "keep_99_seq_len"))


def test_medgpt_ray_report_writes_the_same_sections_elsewhere(tiny_run, tmp_path):
    from medgpt_ray.cli import main

    out = tmp_path / "r" / "tiny.html"
    assert main(["report", str(tiny_run.run_dir), "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert all(f'id="{sid}"' in page for sid in TINY_SECTIONS)
    assert main(["report", str(tmp_path / "no-such-run")]) == 2


def test_tensorboard_event_files_hold_the_loss_of_every_logged_step(tiny_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tiny_run.run_dir / "sft" / "tb"
    assert any(tb.glob("events.out.tfevents.*")), f"no event file in {tb}"
    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    # The Prometheus metric names (medgpt_ray/metrics.py), and the held-out loss.
    assert {"medgpt_train_loss", "medgpt_train_learning_rate", "medgpt_train_step_seconds",
            "medgpt_train_tokens_per_second", "medgpt_eval_loss"} <= scalars, scalars
    logged = {r["step"]: r["loss"] for r in map(json.loads, (tiny_run.run_dir / "sft" / "metrics.jsonl")
                                                .read_text().splitlines()) if "loss" in r}
    assert sorted(logged) == list(range(1, tiny_run.max_steps + 1))
    loss = {e.step: e.value for e in acc.Scalars("medgpt_train_loss")}
    assert set(loss) == set(logged)
    for step, value in logged.items():
        assert loss[step] == pytest.approx(value, rel=1e-5)
    assert len(acc.Scalars("medgpt_eval_loss")) == 1


def test_the_report_of_a_run_that_cleans_shows_the_funnel(raw_run, repo):
    page = (raw_run.run_dir / "report.html").read_text(encoding="utf-8")
    cleaning = page[page.index('<section id="cleaning">'):]
    cleaning = cleaning[:cleaning.index("</section>")]
    assert 'alt="cleaning funnel"' in cleaning and 'alt="quarantine reasons"' in cleaning
    report = json.loads((raw_run.run_dir / "clean" / "report.json").read_text())
    for op, counts in report["operators"].items():
        assert f"<td>{op}</td><td class=\"num\">{counts['in']:,}</td>" in cleaning
    for pii_type in (t for t, n in report["redactions"].items() if n):
        assert f"<td>{pii_type}</td>" in cleaning
    for data_file in (repo / "data/sample/raw").glob("*.jsonl"):
        assert_no_record_text(page, data_file)
