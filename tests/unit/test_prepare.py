"""The streaming train/held-out split (medgpt_ray.data.prepare): the same split an in-memory sort by record hash
gives, written as private Parquet files, quarantine and scratch files handled, no records held by the driver."""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pytest

from medgpt_ray.data.files import load_canonical
from medgpt_ray.data.ops.pii import ORDER
from medgpt_ray.data.ops.record import redact_record
from medgpt_ray.data.prepare import _record_key, prepare_kind, split_positions
from medgpt_ray.data.shards import read_records, read_table

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample"


def test_split_positions_by_hash_with_a_floor_and_a_cap():
    hashes = np.array([50, 10, 40, 10, 30, 20, 60, 70, 80, 90], dtype=np.uint64)
    train, held_out = split_positions(hashes, 0.2)
    assert held_out.tolist() == [1, 3]  # the two lowest hashes; the tie keeps reading order
    assert train.tolist() == [5, 4, 2, 0, 6, 7, 8, 9]
    assert split_positions(hashes[:2], 0.01)[1].tolist() == [1]  # at least one held out from two records
    assert split_positions(hashes[:1], 0.5)[1].tolist() == []
    train, held_out = split_positions(hashes, 0.5, max_records=3)
    assert train.tolist() == [0, 6, 7] and held_out.tolist() == [1]


@pytest.mark.parametrize("fraction,cap", [(0.1, None), (0.3, 7)])
def test_streamed_split_equals_the_in_memory_one(tmp_path, fraction, cap):
    sources = [str(SAMPLE / "formats" / "sft_sharegpt_tools.jsonl"), str(SAMPLE / "sft_sharegpt.jsonl")]
    d = prepare_kind("sft", sources, tmp_path, fraction, cap)
    loaded = load_canonical(sources, "sft")
    redacted = [redact_record(r, "sft", ORDER)[0] for r in loaded.records]  # the tools sample has phones
    ranked = [r for _, r in sorted(((_record_key(r), r) for r in redacted), key=lambda kr: kr[0])]
    n_eval = max(1, round(len(ranked) * fraction))
    train, held_out = ranked[n_eval:], ranked[:n_eval]
    if cap is not None:
        train, held_out = train[:cap], held_out[: max(1, cap // 4)]
    read = [read_records(f) for f in (d.train_file, d.eval_file)]
    assert read == [train, held_out]
    assert all(stat.S_IMODE(Path(f).stat().st_mode) == 0o600 for f in (d.train_file, d.eval_file))
    keys = read_table(d.train_file).column("key").to_pylist()
    assert keys == sorted(keys) and keys[0] == int(_record_key(train[0])[:16], 16)
    assert (d.source_records, d.quarantined) == (loaded.source_count, len(loaded.quarantined)) and d.quarantined
    q = Path(d.quarantine_file)
    assert stat.S_IMODE(q.stat().st_mode) == 0o600
    assert len(q.read_text(encoding="utf-8").splitlines()) == d.quarantined
    assert not list(tmp_path.glob(".*.tmp")), "the scratch file must not stay behind"


def test_nothing_usable_names_the_kind_and_leaves_no_scratch(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nope": 1}\n{oops\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"data.sft: none of the 2 source records"):
        prepare_kind("sft", [str(bad)], tmp_path / "out", 0.1)
    assert not list((tmp_path / "out").glob(".*.tmp"))


def test_a_world_readable_quarantine_from_before_is_replaced_owner_only(tmp_path):
    """Issue 16 item 4: opening an existing 0644 file with O_TRUNC would keep its mode with raw lines in it."""
    import json
    import stat

    from medgpt_ray.data.prepare import prepare_kind

    src = tmp_path / "in.jsonl"
    good = {"conversations": [{"from": "human", "value": "头痛"}, {"from": "gpt", "value": "休息"}]}
    src.write_text(json.dumps(good, ensure_ascii=False) + "\n" + "not json\n" + json.dumps(good) + "\n",
                   encoding="utf-8")
    out = tmp_path / "data"
    out.mkdir(mode=0o755)
    old = out / "quarantine-sft.jsonl"
    old.write_text("old")
    old.chmod(0o644)
    prepare_kind("sft", [str(src)], out, 0.5)
    assert stat.S_IMODE(old.stat().st_mode) == 0o600 and "not json" in old.read_text(encoding="utf-8")
    assert stat.S_IMODE(out.stat().st_mode) == 0o700


def test_files_a_data_directory_holds_but_are_not_read_are_said(tmp_path):
    """A directory given as data: a gzipped file is read as the file it holds, a hidden one is not read, and the
    prepared line, the PreparedData and prepared.json's counts say so (issue 48 item 6: both were dropped without
    a word)."""
    import gzip
    import shutil

    from medgpt_ray.data.prepare import prepared_line
    from medgpt_ray.report.rundata import prepared_counts

    src = tmp_path / "sft"
    src.mkdir()
    sample = SAMPLE / "sft_sharegpt.jsonl"
    shutil.copy(sample, src / "part1.jsonl")
    shutil.copy(sample, src / ".hidden.jsonl")
    plain = prepare_kind("sft", [str(src)], tmp_path / "plain", 0.2)
    (src / "more.jsonl.gz").write_bytes(gzip.compress(sample.read_bytes()))
    d = prepare_kind("sft", [str(src)], tmp_path / "out", 0.2)
    assert d.source_records == 2 * plain.source_records  # the gzipped copy's records count
    assert [(Path(f).name, why) for f, why in d.skipped_files] == [(".hidden.jsonl", "hidden")]
    line = prepared_line(d)
    assert "1 file(s) in its directories not read: " in line and ".hidden.jsonl (hidden)" in line
    assert prepared_counts({"sft": d})["sft"]["files_not_read"] == {"hidden": 1}
    alone = prepare_kind("sft", [str(src / "part1.jsonl")], tmp_path / "out2", 0.2)
    assert alone.skipped_files == [] and "not read" not in prepared_line(alone)
