"""bench/make_real_length_corpus.py: the real-length medical corpus of the throughput benchmark (issue 15).

The mix's shares are exact, every record's length (in characters) lies in its kind's range, and the records parse
through the readers the pipeline uses (data/readers.to_canonical) into canonical sft, preference and pretrain data.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from medgpt_ray.data.readers import to_canonical

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "make_real_length_corpus.py"
N_SFT, N_PREF = 300, 40


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("make_real_length_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def corpus(gen, tmp_path_factory) -> tuple[dict, list[str], dict[str, list[dict]]]:
    out = tmp_path_factory.mktemp("real_length")
    summary = gen.make_corpus(out, N_SFT, N_PREF, seed=3)
    kinds, _, _ = gen.generate(N_SFT, N_PREF, seed=3)
    rows = {k: [json.loads(line) for line in Path(p).read_text(encoding="utf-8").splitlines()]
            for k, p in summary["files"].items()}
    return summary, kinds, rows


def _chars(record: dict) -> int:
    return sum(len(t["value"]) for t in record["conversations"])


def test_mix_shares_are_exact(gen, corpus):
    summary, kinds, rows = corpus
    assert len(rows["sft"]) == len(rows["pretrain"]) == N_SFT and len(rows["preference"]) == N_PREF
    for b in gen.SFT_MIX[:-1]:
        assert summary["counts"]["sft"][b.name] == kinds.count(b.name) == round(b.share * N_SFT)
    assert sum(summary["counts"]["sft"].values()) == N_SFT
    assert sum(b.share for b in gen.SFT_MIX) == pytest.approx(1.0)


def test_lengths_lie_in_their_kinds_ranges(gen, corpus):
    _, kinds, rows = corpus
    ranges = {b.name: b.chars for b in gen.SFT_MIX}
    for kind, record in zip(kinds, rows["sft"], strict=True):
        lo, hi = ranges[kind]
        assert lo <= _chars(record) <= hi, (kind, _chars(record))
        rounds = len(record["conversations"]) // 2
        assert [t["from"] for t in record["conversations"]] == ["human", "gpt"] * rounds
        if kind == "multi_turn":
            assert gen.ROUNDS[0] <= rounds <= gen.ROUNDS[1]
        else:
            assert rounds in (1, 2)
    lo, hi = gen.ANSWER.chars
    for p in rows["preference"]:
        assert lo <= len(p["chosen"]) <= hi and lo <= len(p["rejected"]) <= hi
        assert p["chosen"] != p["rejected"]


def test_measured_distribution_in_characters(gen, corpus):
    summary, kinds, rows = corpus
    m = summary["measured"]
    assert m["unit"] == "chars" and m["sft"]["n"] == N_SFT
    qa = sorted(_chars(r) for r, k in zip(rows["sft"], kinds, strict=True) if k == "qa")
    assert m["sft_by_kind"]["qa"]["max"] == qa[-1] and m["sft"]["max"] == max(_chars(r) for r in rows["sft"])
    assert m["sft"]["p10"] <= m["sft"]["p50"] <= m["sft"]["p90"] <= m["sft"]["p99"] <= m["sft"]["max"]
    assert m["preference_answer"]["n"] == 2 * N_PREF
    assert gen.distribution([5, 1, 3]) == {"n": 3, "p10": 1, "p50": 3, "p90": 5, "p99": 5, "max": 5}


def test_records_parse_through_the_readers(corpus):
    _, _, rows = corpus
    for r in rows["sft"]:
        (rec,) = to_canonical(r, "sft")
        assert [t["role"] for t in rec["conversations"]][:2] == ["user", "assistant"]
    for r in rows["preference"]:
        (rec,) = to_canonical(r, "preference")
        assert rec["chosen"] == r["chosen"] and rec["conversations"][0]["role"] == "user"
    for r in rows["pretrain"]:
        assert to_canonical(r, "pretrain") == [{"text": r["text"]}]


def test_deterministic_by_seed(gen):
    assert gen.generate(50, 5, seed=1) == gen.generate(50, 5, seed=1)
    assert gen.generate(50, 5, seed=1) != gen.generate(50, 5, seed=2)
