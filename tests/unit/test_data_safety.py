"""Hostile inputs to the readers and the cleaner's output directory (issue 16): nothing hangs, nothing crashes,
nothing is deleted that is not ours, nothing private is readable by others."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from medgpt_ray.data.file_rows import iter_rows
from medgpt_ray.data.input_paths import describe_skipped, expand_paths
from medgpt_ray.data.json_record import MAX_JSON_DEPTH
from medgpt_ray.data.kinds import DataFileError
from medgpt_ray.data.output_dir import MARKER, claim_output_dir
from medgpt_ray.data.private import open_private
from medgpt_ray.data.readers import RecordError

GOOD = {"conversations": [{"from": "human", "value": "头痛怎么办"}, {"from": "gpt", "value": "多休息"}]}


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1_000, 100_000])
def test_a_deeply_nested_line_is_one_quarantined_row_not_a_crash(tmp_path, depth):
    f = tmp_path / "deep.jsonl"
    f.write_text(json.dumps(GOOD, ensure_ascii=False) + "\n" + nested(depth) + "\n" + json.dumps(GOOD) + "\n")
    rows = list(iter_rows(f))
    assert [line for line, _ in rows] == [1, 2, 3]
    assert isinstance(rows[1][1], RecordError) and "nested more than" in rows[1][1].reason
    assert rows[0][1] == GOOD and rows[2][1] == GOOD


def test_a_deep_element_of_a_json_array_is_quarantined_and_a_deep_file_is_refused(tmp_path):
    arr = tmp_path / "arr.json"
    arr.write_text("[" + json.dumps(GOOD) + "," + nested(MAX_JSON_DEPTH + 5) + "]")
    rows = list(iter_rows(arr))
    assert rows[0][1] == GOOD and isinstance(rows[1][1], RecordError)
    whole = tmp_path / "whole.json"
    whole.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataFileError, match="nested more than"):
        list(iter_rows(whole))


def test_a_fifo_named_as_input_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(DataFileError, match="FIFO"):
        expand_paths([str(fifo)])


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file: the permission check cannot trigger")
def test_an_unreadable_file_is_named(tmp_path):
    f = tmp_path / "secret.jsonl"
    f.write_text(json.dumps(GOOD) + "\n")
    f.chmod(0)
    with pytest.raises(DataFileError, match="permission denied"):
        expand_paths([str(tmp_path)])


def test_directory_entries_that_are_not_read_are_listed_with_the_reason(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps(GOOD) + "\n")
    (tmp_path / "README.md").write_text("notes")
    (tmp_path / "b.jsonl.zip").write_bytes(b"PK")
    (tmp_path / "c.parquet.gz").write_bytes(b"\x1f\x8b")  # Parquet compresses inside: never wrapped
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "c.jsonl").write_text(json.dumps(GOOD) + "\n")
    os.mkfifo(tmp_path / "pipe.jsonl")
    skipped: list[tuple[Path, str]] = []
    assert expand_paths([str(tmp_path)], skipped) == [tmp_path / "a.jsonl"]
    reasons = {p.name: why for p, why in skipped}
    assert reasons == {"README.md": "unsupported suffix .md", "b.jsonl.zip": "unsupported suffix .jsonl.zip",
                       "c.parquet.gz": "unsupported suffix .parquet.gz", ".cache": "hidden",
                       "pipe.jsonl": "not a regular file"}
    lines = describe_skipped(skipped)
    assert lines[0] == "5 directory entries not read:" and len(lines) == 6


def test_a_gb18030_jsonl_is_read_and_a_bad_line_keeps_its_bytes(tmp_path):
    gbk = tmp_path / "gbk.jsonl"
    gbk.write_bytes((json.dumps(GOOD, ensure_ascii=False) + "\n").encode("gb18030") * 2)
    assert [row for _, row in iter_rows(gbk)] == [GOOD, GOOD]
    mixed = tmp_path / "mixed.jsonl"  # UTF-8 with one corrupt line: not GB18030 throughout
    mixed.write_bytes(json.dumps(GOOD, ensure_ascii=False).encode() + b"\n" + b'{"text": "\xe5\xa4\x00\xff"}\n')
    rows = list(iter_rows(mixed))
    assert rows[0][1] == GOOD
    bad = rows[1][1]
    assert isinstance(bad, RecordError) and "\\xff" in bad.raw and "\ufffd" not in bad.raw


def test_a_private_file_replaces_a_world_readable_one(tmp_path):
    f = tmp_path / "quarantine.jsonl"
    f.write_text("old")
    f.chmod(0o644)
    with open_private(f) as fh:
        fh.write("raw line")
    assert stat.S_IMODE(f.stat().st_mode) == 0o600 and f.read_text() == "raw line"


def test_an_output_directory_that_is_not_ours_is_refused_and_kept(tmp_path):
    out = tmp_path / "project"
    (out / "data").mkdir(parents=True)
    (out / "data" / "mine.txt").write_text("precious")
    with pytest.raises(DataFileError, match="not written by medgpt-ray clean.*--overwrite"):
        claim_output_dir(out, [str(tmp_path / "elsewhere.jsonl")])
    assert (out / "data" / "mine.txt").read_text() == "precious" and not (out / MARKER).exists()
    claim_output_dir(out, [str(tmp_path / "elsewhere.jsonl")], overwrite=True)
    assert (out / MARKER).is_file()
    claim_output_dir(out, [str(tmp_path / "elsewhere.jsonl")])  # ours now: no --overwrite needed


def test_input_inside_output_and_output_inside_input_are_refused(tmp_path):
    raw = tmp_path / "p" / "data" / "raw"
    raw.mkdir(parents=True)
    with pytest.raises(DataFileError, match="inside the output directory"):
        claim_output_dir(tmp_path / "p", [str(raw)], overwrite=True)
    with pytest.raises(DataFileError, match="inside the input directory"):
        claim_output_dir(raw / "out", [str(raw)])


def test_clean_cli_refuses_an_output_holding_its_input_with_one_line_and_rc_2(tmp_path):
    raw = tmp_path / "p" / "data" / "raw"
    raw.mkdir(parents=True)
    (raw / "a.jsonl").write_text(json.dumps(GOOD, ensure_ascii=False) + "\n", encoding="utf-8")
    cli = Path(sys.executable).parent / "medgpt-ray"
    p = subprocess.run([str(cli), "clean", str(raw), "--out", str(tmp_path / "p")], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "RAY_ADDRESS": ""})
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "inside the output directory" in p.stderr and "Traceback" not in p.stderr
    assert (raw / "a.jsonl").is_file() and not (tmp_path / "p" / "clean.log").exists()


def test_an_invalid_signoff_regex_is_a_config_error_naming_the_key():
    from medgpt_ray.config import ConfigError, load_clean_config

    with pytest.raises(ConfigError, match=r"signoff\.phrases.*phrase 1 .* not a valid regular expression"):
        load_clean_config(None, ['signoff.phrases=["(abc"]'])


def test_ray_auth_token_is_made_owner_only(tmp_path):
    from medgpt_ray.run.ray_env import tighten_auth_token

    ray_dir = tmp_path / ".ray"
    ray_dir.mkdir(mode=0o755)
    ray_dir.chmod(0o755)
    token = ray_dir / "auth_token"
    token.write_text("secret")
    token.chmod(0o644)  # as Ray 2.60 writes the token it generates
    assert tighten_auth_token(token) is True
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and stat.S_IMODE(ray_dir.stat().st_mode) == 0o700
    assert tighten_auth_token(token) is False


def test_workers_get_the_growing_cuda_allocator_unless_the_driver_sets_one(monkeypatch):
    """Fixed cached blocks fragmented under the preference losses' logits (ORPO on the H200 died with 7.3 GiB
    reserved but unallocated); a user's own PYTORCH_CUDA_ALLOC_CONF wins."""
    from medgpt_ray.run.ray_env import worker_env

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert worker_env()["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:256")
    assert worker_env()["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:256"


def test_workers_tokenize_on_the_tokenizers_threads_unless_the_user_says_otherwise(monkeypatch):
    # sft encodes a block of conversations a tokenizer call: on a 16-core host 0.71 s for 3,000 with the threads,
    # 1.81 s without (bench/results/first_step_h100_overlap/encode_speed.json).
    from medgpt_ray.run.ray_env import worker_env

    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    assert worker_env()["TOKENIZERS_PARALLELISM"] == "true"
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    assert worker_env()["TOKENIZERS_PARALLELISM"] == "false"
