"""Dedup features (medgpt_ray.data.ops.dedup): exact hashes, MinHash signatures, LSH band keys (no Ray)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from medgpt_ray.config import DedupConfig
from medgpt_ray.data.ops import dedup as d
from medgpt_ray.data.ops import minhash as mh
from medgpt_ray.data.ops.dedup import (
    EXACT_BIT,
    band_hashes,
    dedup_features,
    dedup_text,
    exact_hash,
    exact_keys,
    jaccard_estimate,
)
from medgpt_ray.data.ops.minhash import minhash_signature, shingles

ROOT = Path(__file__).resolve().parents[2]
CFG = DedupConfig()

HYPERTENSION = (
    "高血压是以体循环动脉血压增高为主要特征的临床综合征，常伴有心、脑、肾等靶器官的功能或器质性损害。"
    "多数患者早期没有明显症状，部分患者可出现头晕、头痛、颈项板紧、疲劳、心悸等表现。"
    "诊断主要依靠在未使用降压药物的情况下，非同日三次测量诊室血压，收缩压不低于140毫米汞柱和或舒张压不低于90毫米汞柱。"
    "治疗包括生活方式干预和药物治疗两部分，生活方式干预包括减少钠盐摄入、控制体重、戒烟限酒、规律运动和减轻精神压力。"
    "常用降压药物有钙通道阻滞剂、血管紧张素转换酶抑制剂、血管紧张素受体拮抗剂、利尿剂和β受体阻滞剂，"
    "应根据患者的具体情况个体化选择，并长期规律服药，定期监测血压。"
)
# the same paragraph with two words changed (头痛 -> 耳鸣, 规律运动 -> 适量运动)
HYPERTENSION_NEAR = HYPERTENSION.replace("头晕、头痛", "头晕、耳鸣").replace("规律运动", "适量运动")
DIARRHEA = (
    "小儿腹泻是由多种病原和多种因素引起的以大便次数增多和大便性状改变为特点的消化道综合征，是我国婴幼儿最常见的疾病之一。"
    "轮状病毒是秋冬季婴幼儿腹泻最常见的病原，患儿常先有发热和呕吐，随后出现水样便或蛋花汤样便，容易引起脱水和电解质紊乱。"
    "家长应注意观察孩子的精神状态、尿量、眼窝和前囟是否凹陷，口唇是否干燥。轻度脱水可以在家中口服补液盐，少量多次喂服；"
    "出现精神萎靡、持续呕吐、尿量明显减少或便中带血时，应及时到医院就诊。"
    "腹泻期间应继续喂养，母乳喂养的婴儿继续母乳，可适当补充锌剂，不建议常规使用抗生素和止泻药。"
)


def sft(*turns: tuple[str, str]) -> dict:
    return {"conversations": [{"role": r, "content": c} for r, c in turns]}


def sig(text: str, cfg: DedupConfig = CFG) -> np.ndarray:
    return minhash_signature(d.normalize_for_dedup(text), cfg)


# --------------------------------------------------------------------------------------------------------------
# dedup text and exact hash
# --------------------------------------------------------------------------------------------------------------


def test_identical_records_share_exact_hash():
    a = sft(("user", "我最近头痛，血压150/95mmHg，怎么办？"), ("assistant", "建议低盐饮食，规律服用氨氯地平5mg。"))
    b = json.loads(json.dumps(a))
    assert exact_hash(dedup_text(a, "sft")) == exact_hash(dedup_text(b, "sft"))


@pytest.mark.parametrize(("kind", "a", "b"), [
    ("pretrain", {"text": "高血压患者应长期规律服药，定期监测血压。"},
     {"text": "  高血压患者 应长期规律服药 定期监测血压！！\n"}),
    ("pretrain", {"text": "Aspirin 100mg, once daily."}, {"text": "ASPIRIN100MG ONCE DAILY"}),
    ("pretrain", {"text": "服用ＡＢＣ片，每次１片。"}, {"text": "服用abc片 每次1片"}),  # full width -> half width
    ("sft", sft(("user", "头痛怎么办？"), ("assistant", "多休息，必要时服用布洛芬。")),
     sft(("user", "头痛 怎么办"), ("assistant", "多休息 必要时服用布洛芬……"))),
    ("preference", {"conversations": [{"role": "user", "content": "感冒了吃什么药？"}], "chosen": "多喝水，注意休息。",
                    "rejected": "吃抗生素。"},
     {"conversations": [{"role": "user", "content": "感冒了，吃什么药"}], "chosen": "多喝水 注意休息",
      "rejected": "吃抗生素!"}),
])
def test_whitespace_punctuation_case_do_not_change_exact_hash(kind, a, b):
    assert dedup_text(a, kind) == dedup_text(b, kind)
    assert exact_hash(dedup_text(a, kind)) == exact_hash(dedup_text(b, kind))


def test_dedup_text_is_normalized():
    text = dedup_text({"text": "Hello， 世界！ (Test) 1.5mg\n\t【注意】"}, "pretrain")
    assert text == "hello世界test15mg注意"


def test_roles_and_preference_fields_are_part_of_the_identity():
    q, a = "孩子发烧38.5℃怎么办？", "可以用对乙酰氨基酚退热。"
    base = sft(("user", q), ("assistant", a))
    swapped = sft(("assistant", q), ("user", a))
    assert exact_hash(dedup_text(base, "sft")) != exact_hash(dedup_text(swapped, "sft"))
    pref = {"conversations": [{"role": "user", "content": q}], "chosen": a, "rejected": "不用管。"}
    flipped = {**pref, "chosen": pref["rejected"], "rejected": pref["chosen"]}
    assert dedup_text(pref, "preference") != dedup_text(flipped, "preference")
    # a turn boundary moved is a different record
    moved = sft(("user", q + a[:2]), ("assistant", a[2:]))
    assert dedup_text(base, "sft") != dedup_text(moved, "sft")


@pytest.mark.parametrize(("kind", "record"), [
    ("pretrain", {"content": "x"}),
    ("sft", {"text": "x"}),
    ("sft", {"conversations": [{"role": "user"}]}),
    ("preference", sft(("user", "x"))),
    ("nonsense", {"text": "x"}),
])
def test_dedup_text_rejects_records_of_another_shape(kind, record):
    with pytest.raises(ValueError):
        dedup_text(record, kind)


def prompt(question: str, answer: str | None, **extra) -> dict:
    return {"conversations": [{"role": "user", "content": question}], "answer": answer, **extra}


def test_keys_of_existing_kinds_are_unchanged():
    rec = sft(("user", "头痛怎么办？"), ("assistant", "多休息。"))
    assert dedup_text(rec, "sft") == "user头痛怎么办assistant多休息"
    pref = {"conversations": [{"role": "user", "content": "Q"}], "chosen": "c", "rejected": "r"}
    assert dedup_text(pref, "preference") == "userqchosencrejectedr"
    assert exact_hash(dedup_text({"text": "高血压"}, "pretrain")) == exact_hash("高血压")


def test_prompt_records_dedup_on_turns_and_answer():
    a = prompt("1加1等于几？", "2")
    assert dedup_text(a, "prompt") == "user1加1等于几answer2"
    assert dedup_text(prompt(" 1加1 等于几", "２"), "prompt") == dedup_text(a, "prompt")  # spacing, width
    assert dedup_text(prompt("1加1等于几？", "3"), "prompt") != dedup_text(a, "prompt")  # another answer
    assert dedup_text(prompt("1加1等于几？", None), "prompt") == "user1加1等于几"  # no reference answer
    missing = {"conversations": a["conversations"]}
    assert dedup_text(missing, "prompt") == dedup_text(prompt("1加1等于几？", None), "prompt")
    # the answer is labelled: an answer is not the same as a user turn with that text
    as_turn = {"conversations": [*a["conversations"], {"role": "user", "content": "2"}], "answer": None}
    assert dedup_text(as_turn, "prompt") != dedup_text(a, "prompt")
    with pytest.raises(ValueError, match="answer"):
        dedup_text(prompt("1加1等于几？", 2), "prompt")
    records = [a, prompt("1加1等于几", "2"), prompt("1加1等于几？", "3")]
    out = dedup_features(_table(records), "prompt", CFG)
    hashes = out.column("exact_hash").to_pylist()
    assert hashes[0] == hashes[1] != hashes[2]


def test_tool_turns_are_part_of_the_text_and_tools_are_not():
    call = '{"name": "lookup_drug", "arguments": {"name": "阿莫西林"}}'
    rec = sft(("user", "阿莫西林的用法？"), ("tool_call", call), ("tool", "每次0.5g，每日3次"),
              ("assistant", "每次0.5g，每日3次。"))
    text = dedup_text(rec, "sft")
    assert text == ("user阿莫西林的用法toolcallnamelookupdrugargumentsname阿莫西林"
                    "tool每次05g每日3次assistant每次05g每日3次")
    other_call = sft(("user", "阿莫西林的用法？"), ("tool_call", call.replace("阿莫西林", "头孢")),
                     ("tool", "每次0.5g，每日3次"), ("assistant", "每次0.5g，每日3次。"))
    assert dedup_text(other_call, "sft") != text
    as_user = sft(("user", "阿莫西林的用法？"), ("tool_call", call), ("user", "每次0.5g，每日3次"),
                  ("assistant", "每次0.5g，每日3次。"))
    assert dedup_text(as_user, "sft") != text  # a tool result is not a user turn
    tools = [{"type": "function", "function": {"name": "lookup_drug", "parameters": {}}}]
    assert dedup_text({**rec, "tools": tools}, "sft") == text
    assert dedup_text({**prompt("Q", "A"), "tools": tools}, "prompt") == dedup_text(prompt("Q", "A"), "prompt")


def test_exact_hash_is_hex_blake2b():
    h = exact_hash("高血压")
    # blake2b-128 of the UTF-8 bytes, computed independently (a digest of another hash or encoding differs).
    assert h == "001f6c69658124470b26c346b38f743e"
    assert exact_hash("高血压 ") != h and exact_hash("高血压") == h
    assert h != exact_hash("高血糖")


# --------------------------------------------------------------------------------------------------------------
# shingles and MinHash
# --------------------------------------------------------------------------------------------------------------


def test_shingles():
    assert shingles("高血压病", 2) == {"高血", "血压", "压病"}
    assert shingles("abab", 2) == {"ab", "ba"}
    assert shingles("abc", 5) == {"abc"}
    assert shingles("abcde", 5) == {"abcde"}
    assert shingles("", 3) == {""}
    with pytest.raises(ValueError):
        shingles("abc", 0)


def test_signature_shape_and_identity():
    s = sig(HYPERTENSION)
    assert s.dtype == np.uint64 and s.shape == (CFG.num_perm,)
    assert (s < (1 << 61) - 1).all()
    assert jaccard_estimate(s, sig(HYPERTENSION)) == 1.0
    assert minhash_signature("", CFG).shape == (CFG.num_perm,)
    assert minhash_signature("短", CFG).shape == (CFG.num_perm,)


def test_signature_matches_the_documented_formula():
    """min over the text's distinct shingles of (a*x + b) mod (2^61 - 1), checked with Python integers."""
    text, p = "高血压患者应长期规律服药定期监测血压高血压", (1 << 61) - 1
    hashes, bounds = mh._shingle_hashes([text], CFG.ngram)
    assert bounds.tolist() == [0, len(text) - CFG.ngram + 1]
    xs = {int(v) for v in hashes}
    assert len(xs) == len(shingles(text, CFG.ngram))  # one hash per distinct shingle, no collision
    rng = np.random.default_rng(CFG.seed)
    a = rng.integers(1, p, size=CFG.num_perm, dtype=np.uint64)
    b = rng.integers(0, p, size=CFG.num_perm, dtype=np.uint64)
    expected = [min((int(a[j]) * x + int(b[j])) % p for x in xs) for j in range(CFG.num_perm)]
    assert minhash_signature(text, CFG).tolist() == expected


def test_shingle_hash_depends_only_on_the_shingle():
    # the same n-gram hashes the same at any position of any text in any batch, and a short text hashes as itself
    h_alone, _ = mh._shingle_hashes(["血压监测"], 5)
    h_batch, bounds = mh._shingle_hashes(["高血压患者", "血压监测", "每日血压监测记录"], 5)
    assert h_batch[bounds[1]] == h_alone[0]
    h_long, _ = mh._shingle_hashes(["血压监测记录"], 4)
    h_inner, _ = mh._shingle_hashes(["每日血压监测记录"], 4)
    assert set(h_long.tolist()) <= set(h_inner.tolist())


def test_near_duplicate_shares_a_band_and_unrelated_do_not():
    orig, near, other = sig(HYPERTENSION), sig(HYPERTENSION_NEAR), sig(DIARRHEA)
    assert jaccard_estimate(orig, near) > 0.7
    bands = {name: set(band_hashes(s, CFG.bands, "pretrain")[0].tolist())
             for name, s in (("orig", orig), ("near", near), ("other", other))}
    assert bands["orig"] & bands["near"]
    assert jaccard_estimate(orig, other) < 0.3
    assert not bands["orig"] & bands["other"]


def test_batched_signatures_equal_single_ones(monkeypatch):
    texts = [d.normalize_for_dedup(t) for t in (HYPERTENSION, HYPERTENSION_NEAR, DIARRHEA, "", "短文本", "abcde")]
    texts.append(texts[0] * 40)  # a long text
    single = np.stack([minhash_signature(t, CFG) for t in texts])
    assert (mh.signatures(texts, CFG) == single).all()
    # small groups, pieces and chunks: long texts cut into overlapping pieces give the same signatures
    monkeypatch.setattr(mh, "_PIECE_CHARS", 50)
    monkeypatch.setattr(mh, "_GROUP_CHARS", 300)
    monkeypatch.setattr(mh, "_GROUP_ELEMENTS", 64 * CFG.num_perm)
    monkeypatch.setattr(mh, "_CHUNK_SHINGLES", 16)
    assert (mh.signatures(texts, CFG) == single).all()


def test_seed_and_ngram_change_the_signature():
    base = sig(HYPERTENSION)
    assert (sig(HYPERTENSION, DedupConfig(seed=2)) != base).any()
    assert (sig(HYPERTENSION, DedupConfig(ngram=3)) != base).any()
    assert sig(HYPERTENSION, DedupConfig(num_perm=64, bands=8)).shape == (64,)


_CHILD = """
import json, sys
from medgpt_ray.config import DedupConfig
from medgpt_ray.data.ops.dedup import band_hashes, dedup_text, exact_hash, exact_keys
from medgpt_ray.data.ops.minhash import minhash_signature
text = dedup_text({"text": sys.argv[1]}, "pretrain")
s = minhash_signature(text, DedupConfig())
print(json.dumps({"hash": exact_hash(text), "sig": s.tolist(), "bands": band_hashes(s, 16, "pretrain")[0].tolist(),
                  "exact": exact_keys([exact_hash(text)], "pretrain").tolist()}))
"""


def test_deterministic_across_processes_and_hash_seeds():
    text = dedup_text({"text": HYPERTENSION}, "pretrain")
    s = minhash_signature(text, CFG)
    here = {"hash": exact_hash(text), "sig": s.tolist(), "bands": band_hashes(s, 16, "pretrain")[0].tolist(),
            "exact": exact_keys([exact_hash(text)], "pretrain").tolist()}
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", _CHILD, HYPERTENSION], env=env, cwd=ROOT, capture_output=True,
                             text=True, check=True, timeout=120)
        assert json.loads(out.stdout) == here


# --------------------------------------------------------------------------------------------------------------
# band keys and Jaccard
# --------------------------------------------------------------------------------------------------------------


def test_band_and_exact_keys():
    s = sig(HYPERTENSION)
    keys = band_hashes(s, 16, "pretrain")[0]
    assert keys.dtype == np.uint64 and len(set(keys.tolist())) == 16
    assert not (keys & EXACT_BIT).any()
    # a band's key depends only on that band's rows, its index and the kind
    t = s.copy()
    t[0] ^= np.uint64(1)
    changed = band_hashes(t, 16, "pretrain")[0]
    assert changed[0] != keys[0] and (changed[1:] == keys[1:]).all()
    same_rows = np.tile(s[:8], 16)  # every band holds the same rows: the band index still separates them
    assert len(set(band_hashes(same_rows, 16, "pretrain")[0].tolist())) == 16
    assert not set(band_hashes(s, 16, "sft")[0].tolist()) & set(keys.tolist())
    # exact keys: top bit set, equal for equal hashes, different per kind
    h = [exact_hash("高血压"), exact_hash("高血压"), exact_hash("高血糖")]
    ex = exact_keys(h, "pretrain")
    assert (ex & EXACT_BIT).all() and ex[0] == ex[1] != ex[2]
    assert exact_keys(h[:1], "sft")[0] != ex[0]


def test_bands_must_divide_num_perm():
    with pytest.raises(ValueError, match=r"num_perm=128.*bands=12"):
        band_hashes(sig(HYPERTENSION), 12, "pretrain")
    with pytest.raises(ValueError, match=r"num_perm=128.*bands=12"):
        dedup_features(pa.table({"id": ["a"], "record": ['{"text": "x"}']}), "pretrain",
                       DedupConfig(num_perm=128, bands=12))


def test_jaccard_estimate():
    a = np.arange(8, dtype=np.uint64)
    b = a.copy()
    b[:2] = 99
    assert jaccard_estimate(a, a) == 1.0
    assert jaccard_estimate(a, b) == 0.75
    with pytest.raises(ValueError):
        jaccard_estimate(a, a[:4])


# --------------------------------------------------------------------------------------------------------------
# dedup_features
# --------------------------------------------------------------------------------------------------------------


def _table(records: list[dict]) -> pa.Table:
    return pa.table({
        "id": [f"id{i}" for i in range(len(records))],
        "record": [json.dumps(r, ensure_ascii=False) for r in records],
        "source_line": list(range(1, len(records) + 1)),
    })


def test_dedup_features_small_table():
    records = [{"text": HYPERTENSION}, {"text": HYPERTENSION.replace("，", ", ")}, {"text": HYPERTENSION_NEAR},
               {"text": DIARRHEA}]
    out = dedup_features(_table(records), "pretrain", CFG)
    assert out.column_names == ["id", "record", "source_line", "exact_hash", "dedup_keys", "minhash"]
    assert out.schema.field("exact_hash").type == pa.string()
    assert out.schema.field("dedup_keys").type == pa.list_(pa.uint64())
    assert out.schema.field("minhash").type == pa.binary()
    assert out.column("source_line").to_pylist() == [1, 2, 3, 4]
    hashes = out.column("exact_hash").to_pylist()
    assert hashes[0] == hashes[1] and len({hashes[0], hashes[2], hashes[3]}) == 3
    keys = [set(k) for k in out.column("dedup_keys").to_pylist()]
    assert all(len(k) == 1 + CFG.bands for k in keys)  # the exact key, then one per band
    assert keys[0] == keys[1] and keys[0] & keys[2] and not keys[0] & keys[3]
    sigs = [np.frombuffer(b, dtype="<u8") for b in out.column("minhash").to_pylist()]
    assert all(len(b) == CFG.num_perm * 8 for b in out.column("minhash").to_pylist())
    assert (sigs[0] == sig(HYPERTENSION)).all()
    assert jaccard_estimate(sigs[0], sigs[2]) > 0.7
    # the same table gives the same features
    assert dedup_features(_table(records), "pretrain", CFG).equals(out)


def test_dedup_features_sft_and_exact_only():
    records = [sft(("user", "头痛怎么办？"), ("assistant", "多休息。")),
               sft(("user", "头痛 怎么办"), ("assistant", "多休息"))]
    out = dedup_features(_table(records), "sft", DedupConfig(near=False))
    hashes = out.column("exact_hash").to_pylist()
    assert hashes[0] == hashes[1]
    keys = out.column("dedup_keys").to_pylist()
    assert len(keys[0]) == 1 and keys[0] == keys[1]  # the exact key only
    assert out.column("minhash").to_pylist() == [b"", b""]
    # re-running replaces the feature columns instead of duplicating them
    again = dedup_features(out, "sft", CFG)
    assert again.column_names.count("exact_hash") == 1 and len(again.column("dedup_keys")[0]) == 1 + CFG.bands


def test_dedup_features_empty_table():
    table = pa.table({"id": pa.array([], pa.string()), "record": pa.array([], pa.string())})
    out = dedup_features(table, "pretrain", CFG)
    assert out.num_rows == 0 and out.schema.field("dedup_keys").type == pa.list_(pa.uint64())


def test_dedup_features_errors_name_the_row_not_its_text():
    secret = "秘密文本XYZ"
    table = pa.table({"id": ["good", "bad"], "record": [json.dumps({"text": "ok"}), '{"text": "' + secret]})
    with pytest.raises(ValueError, match="bad") as e:
        dedup_features(table, "pretrain", CFG)
    assert secret not in str(e.value)
    with pytest.raises(ValueError, match="'record'"):
        dedup_features(pa.table({"id": ["a"]}), "pretrain", CFG)
    with pytest.raises(ValueError, match="kind"):
        dedup_features(table, "auto", CFG)
