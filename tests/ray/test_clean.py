"""The Ray Data cleaning pipeline end to end on the shipped dirty fixture (data/sample/raw), whose
README.md lists, by file and line, every planted defect: that list is the ground truth here."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from medgpt_ray.config import CleanConfig
from medgpt_ray.data.clean import clean_corpus
from medgpt_ray.data.convert import record_id

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def truth(repo) -> dict:
    text = (repo / "data/sample/raw/README.md").read_text(encoding="utf-8")
    return json.loads(re.search(r"```json\n(.*?)```", text, re.S).group(1))


@pytest.fixture(scope="module")
def cleaned(ray_cluster, repo, tmp_path_factory):
    out = tmp_path_factory.mktemp("clean")
    lines: list[str] = []
    report = clean_corpus([str(repo / "data/sample/raw")], out, "auto", CleanConfig(batch_size=64), echo=lines.append)
    return out, report, "\n".join(lines)


def kept_tables(out: Path) -> dict[str, list[dict]]:
    """Rows in file order (part files by name), exactly as a reader of the output sees them."""
    return {d.name: [r for f in sorted(d.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
                     for d in sorted((out / "data").iterdir())}


def quarantine(out: Path) -> list[dict]:
    rows = []
    for f in sorted((out / "quarantine").glob("*.jsonl")):
        rows += [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows


def all_output_text(out: Path) -> str:
    parts = [json.dumps(r, ensure_ascii=False) for rows in kept_tables(out).values() for r in rows]
    parts += [json.dumps(r, ensure_ascii=False) for r in quarantine(out)]
    return "\n".join(parts)


def source(repo: Path, name: str) -> str:
    return str(repo / "data/sample/raw" / name)


def test_counts_add_up_and_kinds_are_detected(cleaned, truth):
    out, report, log = cleaned
    assert report["adds_up"]
    assert report["emitted"] + report["quarantined"] == report["records"]
    assert report["source_records"] == sum(f["records"] for f in truth["files"].values())
    assert set(report["per_kind"]) == {"pretrain", "sft"}
    assert "detected sharegpt -> sft" in log and "detected text -> pretrain" in log
    assert sum(len(rows) for rows in kept_tables(out).values()) == report["emitted"]
    assert len(quarantine(out)) == report["quarantined"]
    assert json.loads((out / "report.json").read_text())["emitted"] == report["emitted"]


def test_malformed_lines_are_quarantined_raw_with_their_line_numbers(cleaned, truth, repo):
    out, _, _ = cleaned
    q = {(r["source_file"], r["source_line"]): r for r in quarantine(out)}
    for m in truth["malformed"]:
        row = q[(source(repo, m["file"]), m["line"])]
        assert row["dropped_by"] == "reader" and row["raw"], m
    for s in truth["schema_invalid"]:
        row = q[(source(repo, s["file"]), s["line"])]
        assert row["dropped_by"] == "reader" and row["raw"] is None and row["record"], s


def test_pii_is_gone_and_lookalikes_survive(cleaned, truth):
    out, report, _ = cleaned
    text = all_output_text(out)
    for p in truth["pii"]:
        assert p["value"] not in text, f"{p['type']} planted at {p['file']}:{p['line']} survived"
    for look in truth["lookalikes"] + truth["hard_lookalikes"]:
        assert look["value"] in text, f"{look['type']} at {look['file']}:{look['line']} was altered"
    counts = truth["pii_counts"]
    red = report["redactions"]
    assert red.get("id_card", 0) >= counts["resident_id"]
    assert red.get("phone", 0) >= counts["mobile"] + counts["landline"]
    assert red.get("email", 0) >= counts["email"] and red.get("bank_card", 0) >= counts["bank_card"]
    assert "<ID_CARD>" in text and "<PHONE>" in text


def test_duplicates_collapse_to_the_first_occurrence(cleaned, truth, repo):
    out, report, _ = cleaned
    q = {(r["source_file"], r["source_line"]): r for r in quarantine(out)}
    for d in truth["exact_duplicates"]:
        row = q[(source(repo, d["file"]), d["line"])]
        file_no = int(row["id"].split("-")[0])
        assert row["dropped_by"] == "dedup" and row["reason"].startswith("exact_duplicate_of:"), d
        first = row["reason"].split(":", 1)[1]
        assert first.rsplit("-", 1)[0] == record_id(file_no, d["duplicate_of"], 0).rsplit("-", 1)[0], d
    for d in truth["near_duplicates"]:
        row = q[(source(repo, d["file"]), d["line"])]
        assert row["dropped_by"] == "dedup", d
    assert report["duplicate_clusters"]["exact"] >= 1 and report["duplicate_clusters"]["near"] >= 1


def test_non_answers_dropped_signoffs_stripped(cleaned, truth, repo):
    out, report, _ = cleaned
    q = {(r["source_file"], r["source_line"]): r for r in quarantine(out)}
    for n in truth["non_answers"]:
        assert q[(source(repo, n["file"]), n["line"])]["dropped_by"] == "quality", n
    kept_text = "\n".join(json.dumps(r, ensure_ascii=False) for rows in kept_tables(out).values() for r in rows)
    assert "感谢您的咨询，祝您身体健康！" not in kept_text
    assert report["operators"]["signoff"]["stripped"] >= len(truth["signoffs"]) - 2


def test_outputs_are_sorted_by_stable_id(cleaned):
    out, _, _ = cleaned
    for rows in kept_tables(out).values():
        ids = [r["id"] for r in rows]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
    qids = [r["id"] for r in quarantine(out)]
    assert qids == sorted(qids)


def test_outputs_and_quarantine_are_owner_only(cleaned):
    """Kept records are medical text too: every part file 0600 in 0700 directories, made so, not chmod'ed."""
    out, _, _ = cleaned
    dirs = [out / "quarantine", out / "data", *(out / "data").iterdir()]
    assert all(stat.S_IMODE(d.stat().st_mode) == 0o700 for d in dirs)
    files = [f for d in dirs for f in d.iterdir() if f.is_file()]
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert not (out / "_work").exists()


def test_hostile_inputs_are_quarantined_or_listed_and_the_report_adds_up(ray_cluster, tmp_path):
    """A 1,000-deep JSON line, a GB18030 file and entries that are not data, through the whole cleaner."""
    good = {"conversations": [{"from": "human", "value": "孩子发烧三十九度怎么办"},
                              {"from": "gpt", "value": "先物理降温，超过三十八度五可以服用布洛芬。"}]}
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text(json.dumps(good, ensure_ascii=False) + "\n" + '{"a": ' * 1000 + "1" + "}" * 1000
                                 + "\n", encoding="utf-8")
    other = {"conversations": [{"from": "human", "value": "高血压要注意什么"},
                               {"from": "gpt", "value": "少盐饮食，规律服药，定期测量血压。"}]}
    (src / "b.jsonl").write_bytes((json.dumps(other, ensure_ascii=False) + "\n").encode("gb18030"))
    (src / "notes.md").write_text("not data")
    lines: list[str] = []
    report = clean_corpus([str(src)], tmp_path / "out", "sft", CleanConfig(), echo=lines.append)
    assert report["source_records"] == 3 and report["emitted"] == 2 and report["adds_up"]
    assert [q["reason"] for q in quarantine(tmp_path / "out")] == ["JSON nested more than 64 levels deep"]
    kept = kept_tables(tmp_path / "out")["sft"]
    assert any("高血压" in json.dumps(r, ensure_ascii=False) for r in kept)
    assert any("not read" in line for line in lines) and any("notes.md: unsupported suffix .md" in line
                                                             for line in lines)


def test_an_output_directory_that_is_not_ours_is_refused_with_nothing_deleted(ray_cluster, repo, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.txt").write_text("precious")
    from medgpt_ray.data.kinds import DataFileError

    with pytest.raises(DataFileError, match="--overwrite"):
        clean_corpus([source(repo, "dialogues_sharegpt.jsonl")], tmp_path, "sft", CleanConfig(), echo=lambda _: None)
    assert (tmp_path / "data" / "keep.txt").read_text() == "precious"


def test_an_interrupted_re_run_leaves_neither_data_nor_the_last_runs_report(ray_cluster, repo, tmp_path):
    src, out = [source(repo, "dialogues_sharegpt.jsonl")], tmp_path / "out"
    clean_corpus(src, out, "sft", CleanConfig(), echo=lambda _: None)
    assert (out / "report.json").is_file() and (out / "data").is_dir()

    class CtrlC:  # the progress line of a re-run whose user presses Ctrl-C as its chunks start
        address = None

        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            raise KeyboardInterrupt

        def __exit__(self, *exc):
            return False

    with pytest.raises(KeyboardInterrupt):
        clean_corpus(src, out, "sft", CleanConfig(), echo=lambda _: None, live_progress=CtrlC)
    assert not (out / "report.json").exists() and not (out / "data").exists()


def test_same_input_same_output(cleaned, repo, tmp_path):
    out, _, _ = cleaned
    again = clean_corpus([str(repo / "data/sample/raw")], tmp_path / "again", "auto", CleanConfig(batch_size=16),
                         echo=lambda _: None)
    assert again["emitted"] == json.loads((out / "report.json").read_text())["emitted"]
    assert kept_tables(tmp_path / "again") == kept_tables(out)
    assert quarantine(tmp_path / "again") == quarantine(out)


def test_an_empty_input_gives_an_empty_report(ray_cluster, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    report = clean_corpus([str(empty)], tmp_path / "out", "sft", CleanConfig(), echo=lambda _: None)
    assert report["source_records"] == 0 and report["emitted"] == 0 and report["adds_up"]
    assert (tmp_path / "out" / "report.json").is_file()


def test_auto_kind_on_a_file_with_no_known_rows_says_to_pass_kind(ray_cluster, tmp_path):
    from medgpt_ray.data.readers import DataFileError

    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"foo": 1, "bar": 2}\n')
    with pytest.raises(DataFileError, match="pass --kind"):
        clean_corpus([str(odd)], tmp_path / "out", "auto", CleanConfig(), echo=lambda _: None)


def test_overlapping_parts_are_merged_into_one_sorted_part(tmp_path):
    """The no-global-sort write's safety net: parts whose id ranges overlap become one sorted part (0600 kept)."""
    import pyarrow as pa

    from medgpt_ray.data.clean_output import merge_overlapping_parts, write_part

    q = tmp_path / "quarantine"
    parts = [write_part(pa.table({"id": ids, "x": [1] * len(ids)}), q, "jsonl")
             for ids in (["a1", "a5"], ["a3", "a4"], ["b1", "b2"])]
    assert merge_overlapping_parts(parts) == 1
    assert sorted(f.name for f in q.iterdir()) == ["part-a1.jsonl", "part-b1.jsonl"]
    assert [json.loads(x)["id"] for x in (q / "part-a1.jsonl").read_text().splitlines()] == ["a1", "a3", "a4", "a5"]
    assert stat.S_IMODE((q / "part-a1.jsonl").stat().st_mode) == 0o600
    assert merge_overlapping_parts([write_part(pa.table({"id": ["c1"]}), q, "jsonl")]) == 0



def test_chunks_per_cpu_sets_how_finely_the_input_is_cut(tmp_path):
    """The clean.chunks_per_cpu knob: 1 chunk per CPU or 4, each chunk a contiguous byte range, none lost."""
    from medgpt_ray.data.clean_inputs import chunk_bytes, plan_inputs

    corpus = tmp_path / "big.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"{i} " + "病" * 200}, ensure_ascii=False) + "\n"
                              for i in range(6000)), encoding="utf-8")  # ~3.6 MB: above the 256 KiB floor
    size = corpus.stat().st_size
    plans = {n: plan_inputs([str(corpus)], "pretrain", lambda _: None, cpus=2, chunks_per_cpu=n) for n in (1, 4)}
    assert len(plans[1]) in (2, 3) and len(plans[4]) in (8, 9)
    for chunks in plans.values():
        assert sum(chunk_bytes(c) for c in chunks) == size
        assert all(a.end == b.start for a, b in zip(chunks, chunks[1:], strict=False))


def test_live_progress_line_says_files_chunks_records_rate_and_eta(ray_cluster):
    """What `medgpt-ray clean` prints every few seconds, from counts that tasks push to the real progress actor."""
    import time

    import ray

    from medgpt_ray.run.progress import LiveProgress

    lines: list[str] = []
    with LiveProgress(4, time.monotonic(), lines.append, every_s=0.1, files=2, total_bytes=400) as live:
        actor = ray.get_actor(live.address[0], namespace=live.address[1])
        ray.get(actor.push.remote({"rows": 1500, "chunk_done": 1, "bytes": 100}))
        deadline = time.monotonic() + 20
        while not lines and time.monotonic() < deadline:
            time.sleep(0.05)
    assert lines, "no progress line within 20 s"
    assert re.fullmatch(r"\[clean\] 1/3 2 file\(s\), 1/4 chunks, 1,500 records read \([\d,]+/s\), ETA \d+m\d\ds",
                        lines[0]), lines[0]
    assert live.rows == 1500 and live.done == 1
