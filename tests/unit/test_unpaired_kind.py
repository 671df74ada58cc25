"""The unpaired data kind (KTO, issue 17 item 2): `{"conversations", "completion", "label"}` and TRL's
`{"prompt", "completion", "label"}` onto the canonical unpaired record, malformed lines quarantined with their line
and reason, preference pairs read as two unpaired examples that stay in one split, and the data.unpaired key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medgpt_ray.config import ConfigError, load_config
from medgpt_ray.config.clean import QualityConfig
from medgpt_ray.data.files import load_canonical
from medgpt_ray.data.kinds import source_kinds
from medgpt_ray.data.ops.dedup import dedup_text
from medgpt_ray.data.ops.quality import quality_reason
from medgpt_ray.data.ops.record import redact_record
from medgpt_ray.data.prepare import kind_paths, prepare_kind
from medgpt_ray.data.readers import RecordError, detect_format, to_canonical
from medgpt_ray.data.shards import read_records

USER = [{"role": "user", "content": "发烧39度需要去医院吗？"}]
GOOD = "可先服用布洛芬退热，多喝水；高热超过三天或意识不清时立即就医。"


def write_jsonl(path: Path, lines: list[object]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)) + "\n"
                            for x in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize(("row", "fmt"), [
    ({"conversations": [{"from": "human", "value": USER[0]["content"]}], "completion": GOOD, "label": True},
     "sharegpt_unpaired"),
    ({"conversations": USER, "completion": GOOD, "label": True}, "canonical_unpaired"),
    ({"prompt": USER[0]["content"], "completion": GOOD, "label": 1}, "trl_unpaired"),
    ({"prompt": USER, "completion": [{"role": "assistant", "content": GOOD}], "label": True}, "trl_unpaired"),
])
def test_each_unpaired_format_gives_the_canonical_record(row, fmt):
    assert detect_format(row) == fmt
    assert to_canonical(row, "unpaired") == [{"conversations": USER, "completion": GOOD, "label": True}]


def test_trl_prompts_keep_a_system_field_and_a_false_label():
    row = {"system": "你是医生", "prompt": "头疼怎么办？", "completion": "多喝热水。", "label": 0}
    (r,) = to_canonical(row, "unpaired")
    turns = [{"role": "system", "content": "你是医生"}, {"role": "user", "content": "头疼怎么办？"}]
    assert r == {"conversations": turns, "completion": "多喝热水。", "label": False}


@pytest.mark.parametrize(("row", "reason"), [
    ({"prompt": "q", "completion": "a"}, "missing field 'label'"),
    ({"prompt": "q", "completion": "a", "label": "true"}, "field 'label' is a str, not a boolean"),
    ({"prompt": "q", "completion": "a", "label": 2}, "field 'label' is a int, not a boolean"),
    ({"prompt": "q", "label": True}, "missing field 'completion'"),
    ({"prompt": "q", "completion": " ", "label": True}, "empty field 'completion'"),
    ({"prompt": "q", "completion": [{"role": "user", "content": "x"}], "label": True}, "is not an assistant turn"),
    ({"completion": "a", "label": True}, "missing field 'prompt'"),
    ({"conversations": USER + [{"role": "assistant", "content": "a"}], "completion": "b", "label": True},
     "prompt must end with a user turn"),
])
def test_malformed_unpaired_records_say_why(row, reason):
    with pytest.raises(RecordError, match=reason):
        to_canonical(row, "unpaired")


def test_a_file_quarantines_bad_lines_by_number_and_reason(tmp_path):
    path = write_jsonl(tmp_path / "kto.jsonl", [
        {"conversations": USER, "completion": GOOD, "label": True},
        {"conversations": USER, "completion": "别管它。", "label": "no"},
        '{"prompt": "q", "completion": ',
        {"prompt": "q", "completion": "a", "label": False},
        {"conversations": USER, "chosen": GOOD, "rejected": "别管它。"},  # a pair: two examples
        {"question": "q", "answer": "a"},  # a prompt record is not unpaired data
    ])
    got = load_canonical([path], "unpaired")
    assert [r["label"] for r in got.records] == [True, False, True, False]
    reasons = {q.line: q.reason for q in got.quarantined}
    assert set(reasons) == {2, 3, 6}
    assert reasons[2].startswith("field 'label' is a str") and reasons[3].startswith("invalid JSON")
    assert "cannot be used as unpaired data" in reasons[6]
    assert got.source_count == 6


def test_a_pair_is_two_examples_sharing_its_id():
    pair = {"conversations": USER, "chosen": GOOD, "rejected": "别管它。"}
    chosen, rejected = to_canonical(pair, "unpaired")
    assert (chosen["completion"], chosen["label"], rejected["completion"], rejected["label"]) == \
        (GOOD, True, "别管它。", False)
    assert chosen["pair"] == rejected["pair"] and len(chosen["pair"]) == 16
    assert to_canonical(pair, "preference")[0] == pair  # read as preference data, still a pair


def test_ops_see_the_completion_and_the_label():
    r = {"conversations": [{"role": "user", "content": "我的电话13800138000"}], "completion": "请拨13800138000",
         "label": True}
    redacted, counts = redact_record(r, "unpaired", ["phone"])
    assert counts == {"phone": 2} and "13800138000" not in json.dumps(redacted, ensure_ascii=False)
    assert redacted["label"] is True
    assert dedup_text(r, "unpaired") != dedup_text({**r, "label": False}, "unpaired")
    assert quality_reason({**r, "completion": "好" * 100_000}, "unpaired", QualityConfig()) == "too_long:completion"


def test_prepared_splits_keep_a_pairs_halves_together(tmp_path):
    pairs = [{"conversations": [{"role": "user", "content": f"问题{i}：头疼怎么办？"}],
              "chosen": f"答案{i}：休息，必要时就医。", "rejected": f"答案{i}：不用管。"} for i in range(30)]
    own = [{"conversations": [{"role": "user", "content": f"单独问题{i}"}], "completion": f"单独答案{i}",
            "label": i % 2 == 0} for i in range(10)]
    files = [str(write_jsonl(tmp_path / "pairs.jsonl", pairs)), str(write_jsonl(tmp_path / "own.jsonl", own))]
    d = prepare_kind("unpaired", files, tmp_path / "out", 0.2)
    assert (d.source_records, d.train_records + d.eval_records, d.quarantined) == (40, 70, 0)
    train, held_out = read_records(d.train_file), read_records(d.eval_file)
    train_pairs = {r["pair"] for r in train if "pair" in r}
    held_pairs = [r["pair"] for r in held_out if "pair" in r]
    assert held_pairs and not train_pairs & set(held_pairs)
    assert all(held_pairs.count(p) == 2 for p in held_pairs)  # both halves held out


def test_data_unpaired_is_a_key_and_kto_reads_the_preference_files_too(repo, tmp_path):
    cfg = load_config(repo / "configs/tiny-cpu.yaml",
                      ["data.unpaired=[data/sample/formats/unpaired_kto.jsonl]"])
    assert cfg.data.unpaired == ["data/sample/formats/unpaired_kto.jsonl"]
    assert source_kinds("unpaired") == ("unpaired", "preference")
    assert kind_paths(cfg.data, "unpaired") == cfg.data.unpaired + cfg.data.preference
    with pytest.raises(ConfigError, match="data.unpaired"):
        load_config(repo / "configs/tiny-cpu.yaml", ["data.unpaired=5"])
    with pytest.raises(ValueError, match="data.unpaired or data.preference: no files configured"):
        prepare_kind("unpaired", [], tmp_path, 0.1)
