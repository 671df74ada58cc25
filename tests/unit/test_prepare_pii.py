"""Issue 16 item 2: PII redaction on every path into training. Files given directly as data.<kind> are redacted
by prepare_kind before anything is written (scratch, Parquet, quarantine), counted by type, and trained as given
only with the explicit, logged opt-out data.redact_pii: false, which is part of the data fingerprint. No Ray."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from medgpt_ray.config import CleanConfig, ConfigError, DataConfig, PipelineConfig, load_config
from medgpt_ray.data.clean_output import to_canonical_columns
from medgpt_ray.data.ops.pii import PLACEHOLDERS
from medgpt_ray.data.ops.record import clean_table
from medgpt_ray.data.prepare import data_fingerprint, prepare_kind, redaction_text
from medgpt_ray.data.readers import to_canonical
from medgpt_ray.data.shards import read_records
from medgpt_ray.run.pipeline import Pipeline, RunOptions
from tests.unit.test_ops_pii import luhn_complete, make_id

ID_1 = make_id("11010519850307123")  # checksum-valid resident IDs, as the PII tests build them
ID_2 = make_id("44030419900615456")
CARD = luhn_complete("622202023128861")
PHONES = ["13912345678", "13712345678", "13812345678", "021-62345678"]
FULLWIDTH_PHONE = "１３６１２３４５６７８"
EMAILS = ["li.hua@example.com", "wang@hospital.cn", "doctor@hosp.org"]
SECRETS = [ID_1, ID_2, CARD, *PHONES, FULLWIDTH_PHONE, "13612345678", *EMAILS]
UNPARSEABLE_PHONE = "13512345678"  # only in a line that is not JSON: kept raw in the quarantine, as today


def _jsonl(path: Path, rows: list[object]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows),
                    encoding="utf-8")
    return str(path)


def sft_file(tmp_path: Path) -> str:
    call = json.dumps({"name": "book", "arguments": {"phone": FULLWIDTH_PHONE, "dept": "皮肤科"}}, ensure_ascii=False)
    tools = [{"name": "book", "description": f"预约挂号，人工电话{PHONES[3]}",
              "parameters": {"type": "object", "properties": {"phone": {"type": "string"}}}}]
    return _jsonl(tmp_path / "sft.jsonl", [
        {"conversations": [
            {"from": "human", "value": f"我的身份证号是{ID_1}，电话{PHONES[0]}，邮箱{EMAILS[0]}，银行卡{CARD}"},
            {"from": "gpt", "value": "好的，已记录，请按时到门诊就诊。"}]},
        {"conversations": [
            {"from": "human", "value": "帮我预约明天的皮肤科。"},
            {"from": "function_call", "value": call},
            {"from": "observation", "value": json.dumps({"status": "ok", "contact": EMAILS[1]})},
            {"from": "gpt", "value": f"已为您预约，医生会回电{PHONES[1]}。"}], "tools": tools},
        {"conversations": [{"from": "human", "value": "阿莫西林每次吃多少？"},
                           {"from": "gpt", "value": "成人一般每次500mg，每日3次，请遵医嘱。"}]},
        {"conversations": f"身份证{ID_2}"},  # parsed, not a conversation: quarantined without its text
        f'{{"conversations": [{{"from": "human", "value": "电话{UNPARSEABLE_PHONE}"',  # not JSON
    ])


def preference_file(tmp_path: Path) -> str:
    return _jsonl(tmp_path / "preference.jsonl", [
        {"conversations": [{"from": "human", "value": f"我叫李华，身份证{ID_1}，手机{PHONES[0]}，能挂号吗？"}],
         "chosen": f"可以，请携带身份证到医院挂号，有问题发邮件到{EMAILS[2]}。",
         "rejected": f"把身份证号{ID_1}发给我。"},
        {"question": f"电话{PHONES[2]}是哪个科室？", "response_chosen": "请咨询医院总台。",
         "response_rejected": "不知道"},
        {"conversations": [{"from": "human", "value": "感冒吃什么药？"}], "chosen": "多休息，多喝水。",
         "rejected": "随便吃点抗生素。"},
    ])


def everything_written(out: Path) -> str:
    """The text of every file under `out`: Parquet read back (every column of every row), others as text."""
    parts = []
    for f in sorted(p for p in out.rglob("*") if p.is_file()):
        if f.suffix == ".parquet":
            parts.append(json.dumps(pq.read_table(f).to_pylist(), ensure_ascii=False))
        else:
            parts.append(f.read_text(encoding="utf-8"))
    return "\n".join(parts)


def test_direct_files_are_redacted_before_anything_is_written(tmp_path):
    out = tmp_path / "data"
    sft = prepare_kind("sft", [sft_file(tmp_path)], out, 0.3)
    pref = prepare_kind("preference", [preference_file(tmp_path)], out, 0.3)
    assert sft.redactions == {"email": 2, "id_card": 1, "bank_card": 1, "phone": 4}
    assert pref.redactions == {"email": 1, "id_card": 2, "bank_card": 0, "phone": 2}
    assert (sft.source_records, sft.train_records + sft.eval_records, sft.quarantined) == (5, 3, 2)
    written = everything_written(out)
    leaked = [s for s in SECRETS if s in written]
    assert not leaked, f"raw PII in {out}: {len(leaked)} item(s)"
    assert not list(out.glob(".*.tmp")), "the scratch file must not stay behind"
    records = {kind: read_records(d.train_file) + read_records(d.eval_file) for kind, d in (("sft", sft),
                                                                                         ("preference", pref))}
    text = json.dumps(records, ensure_ascii=False)
    assert all(text.count(p) >= 1 for p in PLACEHOLDERS.values())
    booked = next(r for r in records["sft"] if r.get("tools"))
    assert json.loads(booked["conversations"][1]["content"])["arguments"] == {"phone": "<PHONE>", "dept": "皮肤科"}
    assert booked["tools"][0]["description"] == "预约挂号，人工电话<PHONE>"  # keys and shape kept
    assert "500mg，每日3次" in text  # clinical numbers are not PII
    # The quarantine: the parsed row by file, line and reason only; the unparseable line raw, 0600.
    quarantine = Path(sft.quarantine_file)
    entries = [json.loads(line) for line in quarantine.read_text(encoding="utf-8").splitlines()]
    assert [(e["line"], e["raw"] is None) for e in entries] == [(4, True), (5, False)]
    assert UNPARSEABLE_PHONE in entries[1]["raw"] and stat.S_IMODE(quarantine.stat().st_mode) == 0o600


def test_without_redaction_records_are_trained_as_given(tmp_path):
    out = tmp_path / "data"
    sft = prepare_kind("sft", [sft_file(tmp_path)], out, 0.3, pii_types=())
    pref = prepare_kind("preference", [preference_file(tmp_path)], out, 0.3, pii_types=())
    assert sft.redactions == {} and pref.redactions == {}
    trained = json.dumps([read_records(f) for d in (sft, pref) for f in (d.train_file, d.eval_file)],
                         ensure_ascii=False)
    assert all(s in trained for s in (ID_1, CARD, PHONES[0], PHONES[2], FULLWIDTH_PHONE, *EMAILS))
    assert not any(p in trained for p in PLACEHOLDERS.values())
    assert ID_2 not in everything_written(out)  # a parsed, unusable row is still quarantined without its text


def test_cleaned_data_is_not_redacted_or_counted_twice(tmp_path):
    """data.raw: the cleaner's Parquet (its placeholders included) is read by prepare_kind like any file."""
    rows = [json.loads(line) for line in Path(sft_file(tmp_path)).read_text(encoding="utf-8").splitlines()[:3]]
    records = [r for row in rows for r in to_canonical(row, "sft")]
    table = pa.table({"id": [f"{i:05d}" for i in range(len(records))], "source_file": ["sft.jsonl"] * len(records),
                      "source_line": list(range(1, len(records) + 1)),
                      "record": [json.dumps(r, ensure_ascii=False) for r in records]})
    cleaned = clean_table(table, "sft", CleanConfig(quality={"enabled": False}))  # quality: not the point
    assert cleaned["dropped_by"].to_pylist() == [None] * len(records)
    by_cleaner: dict[str, int] = {}
    for counts in cleaned["redactions"].to_pylist():
        for t, n in json.loads(counts).items():
            by_cleaner[t] = by_cleaner.get(t, 0) + n
    assert by_cleaner == {"id_card": 1, "phone": 4, "email": 2, "bank_card": 1}
    part = tmp_path / "clean" / "data" / "sft" / "part-00000.parquet"
    part.parent.mkdir(parents=True)
    pq.write_table(to_canonical_columns(cleaned, "sft"), part)
    d = prepare_kind("sft", [str(part.parent)], tmp_path / "data", 0.3)
    assert d.redactions == {"email": 0, "id_card": 0, "bank_card": 0, "phone": 0}
    again = json.dumps([read_records(f) for f in (d.train_file, d.eval_file)], ensure_ascii=False)
    assert "<ID_CARD>" in again and again.count("<PHONE>") == 4 and "<BANK_CARD>" in again
    assert not any(s in again for s in SECRETS)


def test_the_data_fingerprint_has_the_redaction_in_it(tmp_path):
    paths = [sft_file(tmp_path)]
    on, off = DataConfig(), DataConfig(redact_pii=False)
    assert data_fingerprint(paths, on) == data_fingerprint(paths, DataConfig())
    assert data_fingerprint(paths, on) != data_fingerprint(paths, off)
    fewer = DataConfig(clean={"pii": {"types": ["id_card"]}})
    assert len({data_fingerprint(paths, c) for c in (on, off, fewer)}) == 3
    # ... and where the pipeline takes it for its stages' fingerprints.
    cfg = {"model": {"path": "tiny"}, "output_dir": str(tmp_path / "runs"), "data": {"sft": paths}}
    fps = [Pipeline(PipelineConfig.model_validate({**cfg, "data": {**cfg["data"], "redact_pii": flag}}))
           ._data_fingerprint("sft") for flag in (True, False)]
    assert fps[0] != fps[1]


def test_the_pipeline_counts_redactions_and_logs_the_opt_out(tmp_path):
    base = {"model": {"path": "tiny"}, "output_dir": str(tmp_path / "runs"),
            "stages": {"pt": {"enabled": False}, "rm": {"enabled": False}},
            "data": {"sft": [sft_file(tmp_path)], "preference": [preference_file(tmp_path)]}}
    lines: list[str] = []
    Pipeline(PipelineConfig.model_validate(base), RunOptions(echo=lines.append))._prepare_data()
    assert lines[0].startswith("data preference: 3 source records -> ")
    assert lines[0].endswith("held out, 5 PII redactions (2 id_card, 2 phone, 1 email)")
    assert "8 PII redactions (1 id_card, 4 phone, 2 email, 1 bank_card), 2 quarantined -> " in lines[1]
    assert not any(s in "\n".join(lines) for s in SECRETS)
    lines.clear()
    off = {**base, "data": {**base["data"], "redact_pii": False}}
    Pipeline(PipelineConfig.model_validate(off), RunOptions(echo=lines.append))._prepare_data()
    assert lines[0] == ("data.redact_pii is false: records from data.preference, data.sft are trained as given, "
                        "not PII-redacted")
    assert len(lines) == 3 and "PII" not in lines[1] + lines[2]


def test_redaction_text_counts_only():
    assert redaction_text({"id_card": 2, "phone": 1, "email": 0}) == ", 3 PII redactions (2 id_card, 1 phone)"
    assert redaction_text({"phone": 1}) == ", 1 PII redaction (1 phone)"
    assert redaction_text({"phone": 0}) == redaction_text({}) == ""


def test_one_switch_turns_pii_redaction_off(tmp_path):
    """data.clean.pii alone would stop only the cleaner's step: the opt-out is data.redact_pii, which the
    cleaning of data.raw honours too."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: {path: tiny}\ndata: {clean: {pii: {enabled: false}}}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"data\.redact_pii: false"):
        load_config(cfg)
    with pytest.raises(ConfigError, match=r"data\.redact_pii: false"):
        load_config(cfg, ["data.clean.pii.enabled=true", "data.clean.pii.types=[]"])
    off = load_config(cfg, ["data.redact_pii=false"]).data
    assert off.pii_types() == [] and not off.clean_config().pii.enabled
    on = DataConfig()
    assert on.clean_config() is on.clean and on.pii_types() == ["id_card", "phone", "email", "bank_card"]
    assert not DataConfig(redact_pii=False).clean_config().pii.enabled
