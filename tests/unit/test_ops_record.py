"""The per-record cleaning pipeline, its Ray Data batch adapter and the sample corpus's ground truth (no Ray)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest

from medgpt_ray.config import CleanConfig, PIIConfig, SignoffConfig
from medgpt_ray.data.file_rows import iter_rows
from medgpt_ray.data.ops.record import (
    CleanOutcome,
    clean_record,
    clean_table,
    map_texts,
    redact_row,
    text_fields,
)
from medgpt_ray.data.ops.signoff import compile_signoffs, strip_signoff
from medgpt_ray.data.readers import RecordError, to_canonical

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "data" / "sample" / "raw"
CFG = CleanConfig()
SIGNOFFS = compile_signoffs(CFG.signoff)
ANSWER = "根据描述考虑上呼吸道感染，可以服用布洛芬退热，多喝水休息，三天不退烧请到发热门诊就诊。"
QUESTION = "医生，我这两天头痛发热，需要吃什么药？"
ID_A = "110105196709131164"  # synthetic, from the sample README


def sft(*turns: tuple[str, str], **extra) -> dict:
    return {"conversations": [{"role": r, "content": c} for r, c in turns], **extra}


def clean(record: dict, kind: str, cfg: CleanConfig = CFG) -> CleanOutcome:
    return clean_record(record, kind, cfg, compile_signoffs(cfg.signoff))


# --------------------------------------------------------------------------------------------------
# field helpers
# --------------------------------------------------------------------------------------------------


def test_text_fields_labels():
    assert text_fields({"text": "甲"}, "pretrain") == [("text", "甲")]
    rec = sft(("system", "s"), ("user", "u"), ("assistant", "a"))
    assert text_fields(rec, "sft") == [("conversations.0.content", "s"), ("conversations.1.content", "u"),
                                       ("conversations.2.content", "a")]
    pref = {"conversations": [{"role": "user", "content": "q"}], "chosen": "c", "rejected": "r"}
    assert text_fields(pref, "preference") == [("conversations.0.content", "q"), ("chosen", "c"), ("rejected", "r")]
    with pytest.raises(ValueError, match="unknown data kind"):
        text_fields(pref, "dpo")


def test_map_texts_roles_copy_and_extra_keys():
    pref = {"conversations": [{"role": "system", "content": "s", "note": 1}, {"role": "user", "content": "q"}],
            "chosen": "c", "rejected": "r", "id": "x1"}
    seen = []
    out = map_texts(pref, "preference", lambda role, text: seen.append(role) or f"{role}:{text}")
    assert seen == ["system", "user", "chosen", "rejected"]
    assert out == {"conversations": [{"role": "system", "content": "system:s", "note": 1},
                                     {"role": "user", "content": "user:q"}],
                   "chosen": "chosen:c", "rejected": "rejected:r", "id": "x1"}
    assert pref["conversations"][0]["content"] == "s" and pref["chosen"] == "c"  # not mutated
    assert map_texts({"text": "t"}, "pretrain", lambda role, text: role) == {"text": "text"}


# --------------------------------------------------------------------------------------------------
# sign-offs
# --------------------------------------------------------------------------------------------------


def test_strip_signoff_repeats_and_only_at_the_end():
    assert strip_signoff(ANSWER + "如有疑问请随时咨询。祝您早日康复！", SIGNOFFS) == (ANSWER, 2)
    assert strip_signoff(ANSWER + "\n感谢您的信任！  ", SIGNOFFS) == (ANSWER, 1)
    assert strip_signoff(ANSWER + "希望对您有帮助，祝您生活愉快！", SIGNOFFS) == (ANSWER, 2)
    middle = "感谢您的咨询。" + ANSWER
    assert strip_signoff(middle, SIGNOFFS) == (middle, 0)
    inside = "用药后如有问题请及时复诊。"  # not at a clause boundary: advice, not a sign-off
    assert strip_signoff(inside, SIGNOFFS) == (inside, 0)
    assert strip_signoff(ANSWER, SIGNOFFS) == (ANSWER, 0)
    assert strip_signoff(ANSWER + "祝您健康！", []) == (ANSWER + "祝您健康！", 0)


def test_signoff_only_text_becomes_empty_and_quality_drops_it():
    assert strip_signoff("感谢您的咨询！祝您早日康复！", SIGNOFFS) == ("", 2)
    out = clean(sft(("user", QUESTION), ("assistant", "感谢您的咨询！祝您早日康复！")), "sft")
    assert (out.dropped_by, out.reason, out.signoffs) == ("quality", "too_short:assistant", 2)


def test_signoff_config():
    assert compile_signoffs(SignoffConfig(enabled=False)) == []
    assert compile_signoffs(CFG.signoff) is not compile_signoffs(CFG.signoff)  # a fresh list over cached patterns
    assert compile_signoffs(CFG.signoff)[0] is compile_signoffs(CFG.signoff)[0]
    with pytest.raises(ValueError, match=r"phrase 1 .* not a valid regular expression"):  # when the config loads
        SignoffConfig(phrases=["(unclosed"])


def test_signoffs_stripped_from_responses_only():
    rec = {"conversations": [{"role": "user", "content": QUESTION + "感谢您的咨询！"}],
           "chosen": ANSWER + "祝您早日康复！", "rejected": "多喝热水就好，不用去医院。祝您健康！"}
    out = clean(rec, "preference")
    assert out.dropped_by is None and out.signoffs == 2
    assert out.record["conversations"][0]["content"] == QUESTION + "感谢您的咨询！"
    assert out.record["chosen"] == ANSWER
    assert out.record["rejected"] == "多喝热水就好，不用去医院。"


# --------------------------------------------------------------------------------------------------
# clean_record
# --------------------------------------------------------------------------------------------------


def test_clean_record_kept_with_counts():
    user = f"我的身份证{ID_A}，手机１３９１２３４５６７８，ｅｍａｉｌ：ｌｉ@qq.com"
    rec = sft(("user", user), ("assistant", ANSWER + "祝您健康！"), id="r1")
    out = clean(rec, "sft")
    assert out.dropped_by is None and out.reason is None
    # normalization ran before PII (full-width digits folded, then the phone found)
    assert out.record["conversations"][0]["content"] == "我的身份证<ID_CARD>，手机<PHONE>，email：<EMAIL>"
    assert out.record["conversations"][1]["content"] == ANSWER
    assert out.record["id"] == "r1"
    assert out.redactions == {"id_card": 1, "phone": 1, "email": 1, "bank_card": 0}
    assert out.signoffs == 1
    assert ID_A in rec["conversations"][0]["content"]  # input not mutated


def test_dropped_record_is_returned_redacted():
    out = clean(sft(("user", f"电话13912345678，身份证{ID_A}"), ("assistant", "好的")), "sft")
    assert (out.dropped_by, out.reason) == ("quality", "low_entropy:assistant")
    text = json.dumps(out.record, ensure_ascii=False)
    assert "13912345678" not in text and ID_A not in text and "<PHONE>" in text
    assert out.redactions["phone"] == 1 and out.redactions["id_card"] == 1


def test_switches():
    rec = sft(("user", "电话13912345678"), ("assistant", "嗯"))
    off = CleanConfig(pii={"enabled": False}, quality={"enabled": False}, normalize={"enabled": False},
                      signoff={"enabled": False})
    out = clean(rec, "sft", off)
    assert out.record == rec and out.dropped_by is None and out.redactions == {} and out.signoffs == 0
    only_email = CleanConfig(pii={"types": ["email"]})
    out = clean(sft(("user", "电话13912345678，a@b.com"), ("assistant", ANSWER)), "sft", only_email)
    assert out.record["conversations"][0]["content"] == "电话13912345678，<EMAIL>"
    assert out.redactions == {"email": 1}


def test_pretrain_record():
    out = clean({"text": "  病历\u3000联系人电话 +86-136-9601-5121 \n\n\n\n血压140/90mmHg "}, "pretrain")
    assert out.record == {"text": "病历 联系人电话 <PHONE>\n\n血压140/90mmHg"}
    assert out.dropped_by is None


# --------------------------------------------------------------------------------------------------
# redact_row (rows that parsed but could not be converted)
# --------------------------------------------------------------------------------------------------


def test_redact_row():
    row = {"question": f"身份证{ID_A}", "extra": {"phones": ["13912345678", "血压140/90mmHg"], "n": 13912345678},
           "answer": None, "ok": True, "dose": 500, "mail": "ｌｉ＠qq.com"}
    out = redact_row(row, PIIConfig())
    assert out == {"question": "身份证<ID_CARD>", "extra": {"phones": ["<PHONE>", "血压140/90mmHg"], "n": "<PHONE>"},
                   "answer": None, "ok": True, "dose": 500, "mail": "<EMAIL>"}
    assert row["question"] == f"身份证{ID_A}"  # not mutated
    unchanged = redact_row(row, PIIConfig(enabled=False))
    assert unchanged == row and unchanged is not row


# --------------------------------------------------------------------------------------------------
# clean_table
# --------------------------------------------------------------------------------------------------


def test_clean_table_round_trip():
    records = [
        sft(("user", QUESTION), ("assistant", ANSWER)),
        sft(("user", "我的卡号4367 4289 0043 5648 930，电话139-1234-5678"), ("assistant", ANSWER)),
        sft(("user", QUESTION), ("assistant", ANSWER + "如有疑问请随时咨询。祝您早日康复！")),
        sft(("user", f"身份证{ID_A}"), ("assistant", "嗯")),
    ]
    raws = [json.dumps(r, ensure_ascii=False) for r in records] + ["{not json"]
    table = pa.table({"id": [f"id{i}" for i in range(5)], "record": raws, "line": [1, 2, 3, 4, 5]})
    out = clean_table(table, "sft", CFG)

    assert out.num_rows == 5
    assert out.column_names == ["id", "record", "line", "dropped_by", "reason", "redactions", "signoffs"]
    assert out.schema.field("record").type == pa.string() and out.schema.field("signoffs").type == pa.int64()
    assert out.column("id").to_pylist() == ["id0", "id1", "id2", "id3", "id4"]
    assert out.column("line").to_pylist() == [1, 2, 3, 4, 5]
    assert out.column("dropped_by").to_pylist() == [None, None, None, "quality", "clean"]
    assert out.column("reason").to_pylist() == [None, None, None, "low_entropy:assistant", "invalid_record_json"]
    assert out.column("signoffs").to_pylist() == [0, 0, 2, 0, 0]

    cleaned = out.column("record").to_pylist()
    for i in range(4):
        expected = clean(records[i], "sft")
        assert json.loads(cleaned[i]) == expected.record
        assert json.loads(out.column("redactions")[i].as_py()) == expected.redactions
    assert cleaned[4] is None
    assert "头痛" in cleaned[0]  # ensure_ascii=False
    assert json.loads(cleaned[2])["conversations"][1]["content"] == ANSWER
    assert ID_A not in cleaned[3]
    red1 = json.loads(out.column("redactions")[1].as_py())
    assert red1 == {"id_card": 0, "phone": 1, "email": 0, "bank_card": 1}
    assert "13912345678" not in cleaned[1] and "139-1234-5678" not in cleaned[1]


def test_clean_table_bad_rows_and_columns():
    wrong_shape = json.dumps({"text": f"身份证{ID_A}"}, ensure_ascii=False)  # a pretrain record fed as sft
    out = clean_table(pa.table({"id": ["a"], "record": [wrong_shape]}), "sft", CFG)
    assert out.column("dropped_by").to_pylist() == ["clean"]
    assert out.column("reason").to_pylist() == ["invalid_record:KeyError"]
    assert ID_A not in out.column("record")[0].as_py()
    with pytest.raises(ValueError, match="missing column 'record'"):
        clean_table(pa.table({"id": ["a"]}), "sft", CFG)
    empty = clean_table(pa.table({"id": pa.array([], pa.string()), "record": pa.array([], pa.string())}), "sft", CFG)
    assert empty.num_rows == 0 and "dropped_by" in empty.column_names


# --------------------------------------------------------------------------------------------------
# the shipped dirty sample corpus, against its ground truth
# --------------------------------------------------------------------------------------------------

KINDS = {"dialogues_sharegpt.jsonl": "sft", "finetune_alpaca.json": "sft", "toyhom_dialogues.csv": "sft",
         "huatuo.jsonl": "sft", "pretrain.jsonl": "pretrain"}
PII_TYPE = {"resident_id": "id_card", "mobile": "phone", "landline": "phone", "email": "email",
            "bank_card": "bank_card"}


@pytest.fixture(scope="module")
def truth() -> dict:
    readme = (RAW / "README.md").read_text(encoding="utf-8")
    return json.loads(re.search(r"```json\n(.*?)\n```", readme, re.S).group(1))


@pytest.fixture(scope="module")
def cleaned() -> dict[tuple[str, int], list[CleanOutcome]]:
    """(file, line) -> outcomes of the canonical records of that source row (rows that convert)."""
    out = {}
    for name, kind in KINDS.items():
        for line, row in iter_rows(RAW / name):
            if isinstance(row, RecordError):
                continue
            try:
                records = to_canonical(row, kind)
            except RecordError:
                continue
            out[(name, line)] = [clean_record(r, kind, CFG, SIGNOFFS) for r in records]
    return out


def _texts(outcomes: list[CleanOutcome]) -> list[str]:
    return [json.dumps(o.record, ensure_ascii=False) for o in outcomes]


def _variants(item: dict) -> set[str]:
    """The planted value and, for numbers, its separator-free digits (so a half-redacted number is caught)."""
    value = item["value"]
    if item["type"] == "email":
        return {value}
    return {value, re.sub(r"[^0-9Xx]", "", value)}


def test_sample_pii_is_gone(truth, cleaned):
    items = truth["pii"]
    assert {i["file"] for i in items} == set(KINDS)
    for item in items:
        key = (item["file"], item["line"])
        assert key in cleaned, f"{key} did not convert"
        for text in _texts(cleaned[key]):
            for v in _variants(item):
                assert v not in text, f"{item['type']} left in {key}"


def test_sample_sharegpt_redaction_counts_are_exact(truth, cleaned):
    name = "dialogues_sharegpt.jsonl"
    expected = dict.fromkeys(PII_TYPE.values(), 0)
    for item in truth["pii"]:
        if item["file"] == name:
            expected[PII_TYPE[item["type"]]] += 1
    got = dict.fromkeys(expected, 0)
    for (f, _line), outcomes in cleaned.items():
        if f == name:
            for o in outcomes:
                for t, n in o.redactions.items():
                    got[t] += n
    assert got == expected  # no false positives among the look-alikes either
    assert sum(expected.values()) == 24


def test_sample_lookalikes_survive_verbatim(truth, cleaned):
    items = truth["lookalikes"] + truth["hard_lookalikes"]
    assert any(i["type"] == "id_bad_checksum" for i in items)
    for item in items:
        key = (item["file"], item["line"])
        assert key in cleaned, f"{key} did not convert"
        # Huatuo rows give one record per paraphrase; the value sits in at least one of them
        assert any(item["value"] in text for text in _texts(cleaned[key])), f"{item['type']} lost in {key}"


def test_sample_non_answers_dropped(truth, cleaned):
    for item in truth["non_answers"]:
        outcomes = cleaned[(item["file"], item["line"])]
        assert all(o.dropped_by == "quality" for o in outcomes), item
        assert all(o.reason in ("low_entropy:assistant", "non_answer:assistant") for o in outcomes), item
    non_answer_keys = {(i["file"], i["line"]) for i in truth["non_answers"]}
    kept_elsewhere = [o for k, outs in cleaned.items() if k not in non_answer_keys for o in outs]
    assert all(o.dropped_by is None for o in kept_elsewhere)  # nothing else in the sample is dropped


def test_sample_signoffs_stripped(truth, cleaned):
    """Every planted sign-off's closing phrase goes with the default phrases; with a 仅供参考 phrase added (not in
    the default list) the whole planted sign-off goes."""
    extra = r"(以上(建议|内容|回答))?仅供参考[^。！!]*[。！!]?"
    extended = CleanConfig(signoff={"phrases": [*SignoffConfig().phrases, extra]})
    ext_patterns = compile_signoffs(extended.signoff)
    for item in truth["signoffs"]:
        key = (item["file"], item["line"])
        for outcome in cleaned[key]:
            assert outcome.signoffs >= 1, key
            last = outcome.record["conversations"][-1]["content"]
            assert not last.endswith(item["value"][-6:]), key
        for name, line in [key]:
            row = next(r for n, r in iter_rows(RAW / name) if n == line)
            for record in to_canonical(row, KINDS[name]):
                out = clean_record(record, KINDS[name], extended, ext_patterns)
                assert item["value"] not in json.dumps(out.record, ensure_ascii=False), key
                assert out.dropped_by is None
