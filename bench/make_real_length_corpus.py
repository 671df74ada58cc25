"""Generate a medical SFT + preference corpus whose LENGTHS are those of real medical SFT data (issue 15, item 7).

    python bench/make_real_length_corpus.py --out /tmp/rl [--sft 4000] [--pref 1000] [--seed 0] [--tokenizer DIR]

Writes, in MedicalGPT's own formats:
  DIR/sft.jsonl         ShareGPT: {"conversations": [{"from": "human"|"gpt", "value": ...}, ...]}
  DIR/preference.jsonl  ShareGPT prompt + answers: {"conversations": [{"from": "human", ...}], "chosen", "rejected"}
  DIR/pretrain.jsonl    {"text": ...}: the text of every SFT conversation, so PT trains on the same tokens as SFT
and prints a JSON summary: the records per kind and the measured length distribution (p10/p50/p90/p99/max), in
tokens of --tokenizer (a tokenizer directory; the tiny preset's or a model's), in characters without one.
Offline, written by us, stdlib only (transformers only to count tokens), deterministic: the same sizes and seed
give the same bytes. The Chinese vocabulary and sentence material come from make_dirty_corpus.py.

Target distribution (content tokens: the turns' text; the chat template adds ~5 tokens per turn):

    SFT kind       share  tokens        what
    qa             55 %   10-60         knowledge QA with a short answer: a drug, a department, an exam, a gene,
                                        a percentage, a dose (tests/data/short_medical_qa.jsonl's flavour)
    consultation   35 %   200-800       a patient's message and a doctor's answer; 20 % add a second round
    multi_turn     10 %   1,000-3,000   3-8 rounds of patient and doctor
    preference    100 %   200-1,500     per answer (chosen and rejected drawn independently); the prompt is one
                                        patient message of ~30-100 tokens

Why: real medical SFT sets (Huatuo/knowledge-graph QA, MedicalGPT's medical finetune data) are dominated by
short factual QA, then single consultations of a few hundred tokens, with a tail of long multi-turn dialogues;
MedicalGPT's preference answers run to a few hundred tokens and more. The SFT mix's p50 is therefore a short QA
and its p90/p99 a long dialogue: the case where padding to the longest row of a micro-batch wastes most of it.

Each record's length is drawn log-uniformly in its kind's range (so the median is the range's geometric middle:
~400 tokens for a consultation, ~1,700 for a multi-turn dialogue, ~550 for an answer) and enforced exactly in
characters at CHARS_PER_TOKEN (1.40 characters per token was measured for the tiny preset's tokenizer on this
text; run with --tokenizer to see the real token counts, which hold the ranges to within a few per cent). Short QA
are a question and an answer (half with a clause or two of explanation) redrawn until they fit the range. Counts
per kind are exact (rounded shares), in shuffled order.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_dirty_corpus as dirty  # noqa: E402  (the vocabulary and sentence material)

CHARS_PER_TOKEN = 1.4


@dataclass(frozen=True)
class Bucket:
    name: str
    share: float
    tokens: tuple[int, int]  # the target range, documented above
    chars: tuple[int, int]  # what the generator enforces


def _bucket(name: str, share: float, lo: int, hi: int) -> Bucket:
    return Bucket(name, share, (lo, hi), (round(lo * CHARS_PER_TOKEN), round(hi * CHARS_PER_TOKEN)))


# QA's lower bound is 16 characters, not 14: their short answers tokenize at ~1.5 characters per token.
SFT_MIX = (Bucket("qa", 0.55, (10, 60), (16, 84)), _bucket("consultation", 0.35, 200, 800),
           _bucket("multi_turn", 0.10, 1000, 3000))
ANSWER = _bucket("answer", 1.0, 200, 1500)
ROUNDS = (3, 8)  # multi_turn rounds (one patient and one doctor turn each)

# Well-known gene associations and percentage facts: the gene and percentage answers of the short QA.
GENES = [("遗传性乳腺癌和卵巢癌", "BRCA1、BRCA2"), ("非小细胞肺癌的靶向治疗", "EGFR"), ("囊性纤维化", "CFTR"),
         ("β地中海贫血", "HBB"), ("马凡综合征", "FBN1"), ("亨廷顿病", "HTT"), ("杜氏肌营养不良", "DMD"),
         ("家族性腺瘤性息肉病", "APC"), ("多发性内分泌腺瘤2型", "RET"), ("真性红细胞增多症", "JAK2 V617F")]
PERCENTAGES = [("糖尿病患者糖化血红蛋白的一般控制目标是多少？", "低于7%"),
               ("左心室射血分数的正常值是多少？", "50%以上"), ("正常成人静息时血氧饱和度一般不低于多少？", "95%"),
               ("成年人体内水分约占体重的多少？", "约60%"), ("血浆约占全血容量的多少？", "约55%")]


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))


# --------------------------------------------------------------------------------------------------------------
# text
# --------------------------------------------------------------------------------------------------------------


def qa_pair(rng: random.Random) -> tuple[str, str]:
    """One knowledge question and its short answer."""
    name, dept, symptoms, exams, drugs, advice = rng.choice(dirty.CONDITIONS)
    drug, dose, freq = rng.choice(drugs)
    kind = rng.randrange(8)
    if kind == 0:
        q, a = f"{name}应该挂什么科？", dept
    elif kind == 1:
        q, a = f"{name}的常用药物有哪些？", "、".join(d[0] for d in rng.sample(drugs, rng.randint(1, len(drugs))))
    elif kind == 2:
        q, a = f"怀疑{name}首先要做什么检查？", rng.choice(exams)
    elif kind == 3:
        q, a = f"{drug}主要用于治疗什么病？", name
    elif kind == 4:
        q, a = f"{drug}的常用剂量是多少？", f"每次{dose}，{freq}"
    elif kind == 5:
        q, a = "、".join(rng.sample(symptoms, 2)) + "常见于什么病？", name
    elif kind == 6:
        disease, gene = rng.choice(GENES)
        q, a = f"{disease}相关的主要基因是什么？", gene
    else:
        q, a = rng.choice(PERCENTAGES)
    if kind < 6 and rng.random() < 0.5:  # a clause or two of explanation: QA answers are not all one word
        a += "。" + "，".join(rng.sample(advice, rng.randint(1, 2)))
    return q, a


def _paragraph(rng: random.Random, cond: tuple) -> str:
    """One paragraph of a doctor's answer about `cond`, from the dirty corpus's material."""
    name, dept, symptoms, exams, drugs, advice = cond
    kind = rng.randrange(5)
    if kind == 0:
        return dirty.gpt_message(rng, cond, dirty._numbers(rng))
    if kind == 1:
        syms = "、".join(rng.sample(symptoms, rng.randint(2, len(symptoms))))
        return (f"{name}常见的表现有{syms}，程度因人而异。建议到{dept}就诊，完善{'、'.join(exams)}等检查，"
                "明确诊断后再决定治疗方案。")
    if kind == 2:
        doses = rng.sample(drugs, rng.randint(1, len(drugs)))
        return "".join(f"{d}：每次{dose}，{freq}。" for d, dose, freq in doses) + "具体用药请遵医嘱，不要自行加减药量。"
    if kind == 3:
        return "生活上要注意：" + "；".join(rng.sample(advice, rng.randint(2, len(advice)))) + "。"
    nums = dirty._numbers(rng)
    return (rng.choice(dirty.FOLLOWUP_ANSWERS).format(**nums) + "。"
            + rng.choice(dirty.WARNINGS).format(sym2=rng.choice(symptoms), days=nums["days"]) + "。")


def answer_text(rng: random.Random, cond: tuple, n_chars: int) -> str:
    """A doctor's answer of exactly `n_chars` characters (paragraphs until long enough, cut at a full stop)."""
    text = ""
    while len(text) < n_chars:
        text += ("\n" if text else "") + _paragraph(rng, cond)
    return text[: n_chars - 1] + "。"


# --------------------------------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------------------------------


def _patient(rng: random.Random) -> tuple[tuple, str]:
    cond, other = rng.sample(dirty.CONDITIONS, 2)
    return cond, dirty.human_message(rng, cond, other, dirty._numbers(rng))


def qa_record(rng: random.Random) -> list[list[str]]:
    lo, hi = SFT_MIX[0].chars
    while True:  # redraw the rare pair outside the range
        q, a = qa_pair(rng)
        if lo <= len(q) + len(a) <= hi:
            return [["human", q], ["gpt", a]]


def consultation_record(rng: random.Random) -> list[list[str]]:
    cond, human = _patient(rng)
    total = max(log_uniform(rng, *SFT_MIX[1].chars), len(human) + 80)  # a long message still gets an answer
    if rng.random() < 0.2:
        follow = rng.choice(dirty.FOLLOWUPS).format(drug=rng.choice(cond[4])[0])
        rest = total - len(human) - len(follow)
        first = rest * 2 // 3
        return [["human", human], ["gpt", answer_text(rng, cond, first)], ["human", follow],
                ["gpt", answer_text(rng, cond, rest - first)]]
    return [["human", human], ["gpt", answer_text(rng, cond, total - len(human))]]


def multi_turn_record(rng: random.Random) -> list[list[str]]:
    cond, first = _patient(rng)
    rounds = rng.randint(*ROUNDS)
    humans = [first] + [rng.choice(dirty.FOLLOWUPS + dirty.QUESTIONS).format(drug=rng.choice(cond[4])[0],
                                                                           cond=cond[0]) for _ in range(rounds - 1)]
    rest = max(log_uniform(rng, *SFT_MIX[2].chars) - sum(len(h) for h in humans), 40 * rounds)
    weights = [rng.uniform(0.5, 1.5) for _ in range(rounds)]
    sizes = [int(rest * w / sum(weights)) for w in weights]
    sizes[-1] += rest - sum(sizes)  # the rounding remainder: the total is exact
    turns: list[list[str]] = []
    for h, n in zip(humans, sizes, strict=True):
        turns += [["human", h], ["gpt", answer_text(rng, cond, n)]]
    return turns


SFT_MAKERS = {"qa": qa_record, "consultation": consultation_record, "multi_turn": multi_turn_record}


def preference_record(rng: random.Random) -> dict[str, Any]:
    """A consultation prompt; chosen answers about the patient's condition, rejected about another one."""
    cond, human = _patient(rng)
    wrong = rng.choice([c for c in dirty.CONDITIONS if c is not cond])
    return {"conversations": [{"from": "human", "value": human}],
            "chosen": answer_text(rng, cond, log_uniform(rng, *ANSWER.chars)),
            "rejected": answer_text(rng, wrong, log_uniform(rng, *ANSWER.chars))}


def sft_kinds(n: int, rng: random.Random) -> list[str]:
    """Exactly round(share * n) records of each kind (the last takes the rest), shuffled."""
    counts = [round(b.share * n) for b in SFT_MIX[:-1]]
    kinds = [b.name for b, c in zip(SFT_MIX, counts, strict=False) for _ in range(c)]
    kinds += [SFT_MIX[-1].name] * (n - len(kinds))
    rng.shuffle(kinds)
    return kinds


def generate(n_sft: int, n_pref: int, seed: int = 0) -> tuple[list[str], list[dict], list[dict]]:
    """(the kind of each SFT record, the SFT records, the preference records), all ShareGPT."""
    rng = random.Random(seed)
    kinds = sft_kinds(n_sft, rng)
    sft = [{"conversations": [{"from": f, "value": v} for f, v in SFT_MAKERS[k](rng)]} for k in kinds]
    pref = [preference_record(rng) for _ in range(n_pref)]
    return kinds, sft, pref


# --------------------------------------------------------------------------------------------------------------
# measured distribution
# --------------------------------------------------------------------------------------------------------------


def distribution(lengths: list[int]) -> dict[str, int]:
    """n, p10/p50/p90/p99 (nearest rank) and max."""
    s = sorted(lengths)
    if not s:
        return {"n": 0}
    out = {"n": len(s)}
    for p in (10, 50, 90, 99):
        out[f"p{p}"] = s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]
    out["max"] = s[-1]
    return out


def _counter(tokenizer_dir: str | None):
    """Length of a list of texts, in tokens of `tokenizer_dir` or in characters."""
    if tokenizer_dir is None:
        return "chars", lambda texts: [len(t) for t in texts], None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.model_max_length = 10**9  # counting only: no "longer than the maximum" warning for long dialogues
    return "tokens", lambda texts: [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]], tok


def measure(kinds: list[str], sft: list[dict], pref: list[dict], tokenizer_dir: str | None = None) -> dict[str, Any]:
    """The length distribution of the SFT records (all, and per kind: the turns' text summed), of the preference
    prompts and answers, and with a tokenizer that has a chat template, of the SFT rows as the trainer sees them."""
    unit, count, tok = _counter(tokenizer_dir)
    sft_len = [sum(count([t["value"] for t in r["conversations"]])) for r in sft]
    out: dict[str, Any] = {"unit": unit, "sft": distribution(sft_len),
                           "sft_by_kind": {b.name: distribution([n for n, k in zip(sft_len, kinds, strict=True)
                                                                 if k == b.name]) for b in SFT_MIX},
                           "preference_prompt": distribution(count([p["conversations"][0]["value"] for p in pref])),
                           "preference_answer": distribution(count([p[k] for p in pref for k in ("chosen",
                                                                                                 "rejected")]))}
    if tok is not None and getattr(tok, "chat_template", None):
        role = {"human": "user", "gpt": "assistant"}
        rendered = [len(tok.apply_chat_template([{"role": role[t["from"]], "content": t["value"]}
                                                  for t in r["conversations"]], tokenize=True,
                                                 return_dict=True)["input_ids"]) for r in sft]
        out["sft_rendered"] = distribution(rendered)
    return out


def targets() -> dict[str, Any]:
    """The documented target mix, for the summary."""
    return {"sft": {b.name: {"share": b.share, "tokens": b.tokens, "chars": b.chars} for b in SFT_MIX},
            "multi_turn_rounds": ROUNDS, "preference_answer": {"tokens": ANSWER.tokens, "chars": ANSWER.chars},
            "chars_per_token": CHARS_PER_TOKEN}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def make_corpus(out: Path, n_sft: int, n_pref: int, seed: int = 0, tokenizer_dir: str | None = None
                ) -> dict[str, Any]:
    """Write the three files under `out`; return the summary (paths, counts, targets, measured distribution)."""
    kinds, sft, pref = generate(n_sft, n_pref, seed)
    out.mkdir(parents=True, exist_ok=True)
    files = {"sft": out / "sft.jsonl", "preference": out / "preference.jsonl", "pretrain": out / "pretrain.jsonl"}
    write_jsonl(files["sft"], sft)
    write_jsonl(files["preference"], pref)
    write_jsonl(files["pretrain"], [{"text": "\n".join(t["value"] for t in r["conversations"])} for r in sft])
    return {"seed": seed, "tokenizer": tokenizer_dir, "files": {k: str(v) for k, v in files.items()},
            "counts": {"sft": {b.name: kinds.count(b.name) for b in SFT_MIX}, "preference": len(pref),
                       "pretrain": len(sft)},
            "targets": targets(), "measured": measure(kinds, sft, pref, tokenizer_dir)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--sft", type=int, default=4000, help="SFT conversations (and pretraining documents)")
    ap.add_argument("--pref", type=int, default=1000, help="preference pairs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", help="a tokenizer directory: measure in its tokens (default: characters)")
    a = ap.parse_args(argv)
    print(json.dumps(make_corpus(a.out, a.sft, a.pref, a.seed, a.tokenizer), ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
