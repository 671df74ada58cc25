"""bench/make_dirty_corpus.py: the seeded, streaming generator of the dirty ShareGPT benchmark corpus."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import subprocess
import sys
from collections import Counter
from datetime import date
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "make_dirty_corpus.py"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("make_dirty_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def corpus(gen) -> tuple[list[str], dict]:
    """20,000 records generated in process: enough for the rates to be meaningful."""
    buf = io.StringIO()
    summary = gen.write_corpus(buf, 20_000, seed=7)
    text = buf.getvalue()
    assert text.endswith("\n")
    return text.split("\n")[:-1], summary


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True,
                          timeout=300)


def parse(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None


def test_same_seed_same_bytes_and_line_count(tmp_path, gen):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    first = run_cli("--records", "2000", "--out", str(a), "--seed", "3")
    run_cli("--records", "2000", "--out", str(b), "--seed", "3")
    run_cli("--records", "2000", "--out", str(c), "--seed", "4")
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    assert a.read_bytes().count(b"\n") == 2000
    # the same bytes in process (another interpreter, another hash seed)
    buf = io.StringIO()
    gen.write_corpus(buf, 2000, seed=3)
    assert buf.getvalue().encode("utf-8") == a.read_bytes()
    summary = json.loads(first.stdout)
    assert summary["records"] == 2000 and sum(summary["counts"].values()) == 2000
    assert summary["bytes"] == a.stat().st_size


def test_zero_records_and_nested_output_dir(tmp_path):
    out = tmp_path / "x" / "y" / "empty.jsonl"
    run_cli("--records", "0", "--out", str(out))
    assert out.read_bytes() == b""


def test_progress_is_reported_every_100k(gen):
    err = io.StringIO()
    gen.write_corpus(io.StringIO(), 10, seed=0, progress=err)
    assert err.getvalue() == ""
    assert gen.PROGRESS_EVERY == 100_000


def test_malformed_rate_within_tolerance(corpus, gen):
    lines, summary = corpus
    assert len(lines) == 20_000
    bad = sum(parse(line) is None for line in lines)
    assert bad == summary["counts"]["malformed"]
    assert 5 <= bad <= 45  # expected 20 (0.1%)


def test_category_rates(corpus, gen):
    _, summary = corpus
    counts = summary["counts"]
    assert sum(counts.values()) == 20_000
    for name, rate in gen.RATES.items():
        if name != "malformed":
            assert abs(counts[name] / 20_000 - rate) < 0.01, name


def test_every_wellformed_line_is_sharegpt(corpus):
    lines, _ = corpus
    for line in lines:
        obj = parse(line)
        if obj is None:
            continue
        assert isinstance(obj, dict) and list(obj) == ["conversations"]
        turns = obj["conversations"]
        assert len(turns) >= 2 and len(turns) % 2 == 0
        for i, turn in enumerate(turns):
            assert turn.keys() == {"from", "value"}
            assert turn["from"] == ("human" if i % 2 == 0 else "gpt")
            assert isinstance(turn["value"], str) and turn["value"].strip()


def test_duplicates_and_variety(corpus):
    lines, summary = corpus
    counts = Counter(lines)
    repeats = sum(n - 1 for n in counts.values())
    assert repeats >= summary["counts"]["exact_dup"]
    assert repeats <= summary["counts"]["exact_dup"] + 20  # normal records differ from each other
    objs = [obj for obj in map(parse, lines) if obj]
    answers = Counter(t["value"] for obj in objs for t in obj["conversations"] if t["from"] == "gpt")
    assert answers["嗯"] + answers["好的"] + answers["谢谢"] > 100  # low-information answers
    assert sum(n for a, n in answers.items() if a.endswith("感谢您的咨询，祝您身体健康！")) > 20  # sign-offs


# the generator's ID templates (bare 18-digit runs may also be bank cards)
ID_RE = re.compile(r"(?:身份证号是|身份证|身份证号码：|证件号)(\d{17}[\dXx])(?!\d)")


def test_pii_is_present_and_valid(corpus, gen):
    lines, _ = corpus
    text = "\n".join(lines)
    ids = ID_RE.findall(text)
    assert len(ids) > 100
    for rid in ids:
        assert rid[:2] in gen.PROVINCES
        date(int(rid[6:10]), int(rid[10:12]), int(rid[12:14]))  # a real birth date
        assert gen.id_check_digit(rid[:17]) == rid[17].upper()
    assert re.search(r"1\d{2}-\d{4}-\d{4}", text)  # 138-1234-5678
    assert re.search(r"[\u4e00-\u9fff][a-z][a-z._]*\d+@[a-z0-9]+\.com[\u4e00-\u9fff]", text)  # email glued to CJK
    assert "国药准字H20" in text and "mmHg" in text  # clinical numbers that must survive PII redaction


def test_checksums(gen):
    import random

    assert gen.id_check_digit("11010519491231002") == "X"  # the GB 11643 example 11010519491231002X
    assert gen.luhn_check_digit("411111111111111") == "1"  # 4111 1111 1111 1111
    rng = random.Random(0)
    for _ in range(200):
        card = gen.bank_card(rng).replace(" ", "")
        assert 16 <= len(card) <= 19
        digits = [int(c) for c in reversed(card)]
        assert sum(d if i % 2 == 0 else (d * 2 - 9 if d > 4 else d * 2) for i, d in enumerate(digits)) % 10 == 0
        rid = gen.resident_id(rng)
        assert len(rid) == 18 and gen.id_check_digit(rid[:17]) == rid[17].upper()
