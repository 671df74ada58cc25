"""Generate data/sample/rl/: a toy task for the RL stages that the tiny model can learn on a CPU in a minute
(stdlib only, deterministic: byte-identical on every run).

    python data/sample/rl/make_rl.py

writes

    department_prompts.jsonl  MedicalGPT GRPO {"question", "answer"}: a patient and a diagnosis, "which department?",
                              the answer one of four department names (grpo, kind prompt)
    department_sft.jsonl      ShareGPT conversations answering the same question with the department name, on
                              *other* diagnoses (sft, kind sft)
    department_pairs.jsonl    MedicalGPT preference pairs (ShareGPT prompt turn, "chosen", "rejected"): the same kind of
                              question on the RL diagnoses, chosen the right department, rejected a wrong one (of the
                              four or another) or the right one misspelt (rm, kind preference: the reward model
                              the rloo stage is rewarded by)

The SFT file teaches the format and the four answers, not which department treats the prompts' diagnoses: those
are disjoint from the SFT file's, so after SFT the model answers in the format but guesses the department, and the
accuracy reward has room to rise under GRPO. A training demo, not triage advice.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEPARTMENTS = ("心内科", "呼吸科", "消化科", "神经科")
# Diagnoses the GRPO prompts ask about (four per department) and other ones the SFT conversations use.
RL_DIAGNOSES = {
    "心内科": ("冠心病", "心绞痛", "高血压", "心律失常"),
    "呼吸科": ("哮喘", "肺炎", "支气管炎", "慢阻肺"),
    "消化科": ("胃炎", "胃溃疡", "肠炎", "肝硬化"),
    "神经科": ("偏头痛", "癫痫", "脑梗死", "帕金森病"),
}
SFT_DIAGNOSES = {
    "心内科": ("心肌炎", "心力衰竭"),
    "呼吸科": ("肺结核", "肺气肿"),
    "消化科": ("胰腺炎", "胃食管反流"),
    "神经科": ("面瘫", "眩晕症"),
}
SEXES = ("男", "女")
QUESTIONS = (
    "患者{sex}，{age}岁，诊断为{dx}，应到哪个科室就诊？",
    "{age}岁{sex}性患者确诊{dx}，请问挂哪个科？",
    "一位{age}岁的{sex}性患者患有{dx}，应该去哪个科室？",
    "{dx}患者，{sex}，{age}岁，该看哪个科室？",
)
INSTRUCTION = "只回答科室名称。"
PROMPTS = 480
SFT_CONVERSATIONS = 160


def _question(rng: random.Random, dx: str) -> str:
    template = rng.choice(QUESTIONS)
    return template.format(sex=rng.choice(SEXES), age=rng.randint(18, 85), dx=dx) + INSTRUCTION


def answer_text(dept: str) -> str:
    """The department name alone: a completion of 2-4 tokens keeps generation cheap on a CPU (the tiny model's
    tokenizer spells the <think>/<answer> tags in 30 tokens)."""
    return dept


def _unique(rng: random.Random, table: dict[str, tuple[str, ...]], n: int) -> list[tuple[str, str]]:
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    pairs = [(dept, dx) for dept, dxs in table.items() for dx in dxs]
    while len(out) < n:
        dept, dx = pairs[len(out) % len(pairs)]
        q = _question(rng, dx)
        if q not in seen:
            seen.add(q)
            out.append((q, dept))
    rng.shuffle(out)
    return out


PAIRS = 480
PAIRS_SEED = 20261202  # its own generator: adding the pairs leaves the other two files byte-identical


# Real departments outside the four: plausible wrong answers (a policy rewarded by a reward model that never saw
# "内科" learns to answer it for 心内科 and 消化科 alike).
OTHER_DEPARTMENTS = ("内科", "外科", "急诊科", "全科")


def malformed(dept: str, kind: int) -> str:
    """The right department in a wrong form: its name cut before 科, 科 doubled, or its stem stuttered."""
    return (dept[:-1], dept + "科", dept[:-1] + dept)[kind % 3]


def department_pairs(n: int = PAIRS) -> list[dict]:
    """Preference pairs on the RL diagnoses: a question, the right department chosen, and rejected in turn: another
    of the four departments (two pairs in four, the three in turn), a real department outside them, or the right
    one in a wrong form (malformed). A reward model trained on the four alone scores the first characters: it pays
    "神经" like "神经科" and "内科" like "心内科", and an RL policy rewarded by it learns to answer those. The questions
    are drawn afresh (other ages, sexes and phrasings than the prompt file's, a few coincide), so the reward model
    learns the diagnosis -> department map, not the prompts' text."""
    rng = random.Random(PAIRS_SEED)
    out = []
    for i, (q, dept) in enumerate(_unique(rng, RL_DIAGNOSES, n)):
        wrong = [d for d in DEPARTMENTS if d != dept]
        rejected = (wrong[(i // 4 + i) % 3], wrong[(i // 4 + i) % 3], OTHER_DEPARTMENTS[(i // 4) % 4],
                    malformed(dept, i // 4))[i % 4]
        out.append({"conversations": [{"from": "human", "value": q}], "chosen": answer_text(dept),
                    "rejected": answer_text(rejected)})
    return out


def main() -> None:
    rng = random.Random(20261201)
    prompts = [{"question": q, "answer": dept} for q, dept in _unique(rng, RL_DIAGNOSES, PROMPTS)]
    sft = [{"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": answer_text(dept)}]}
           for q, dept in _unique(rng, SFT_DIAGNOSES, SFT_CONVERSATIONS)]
    for name, rows in (("department_prompts.jsonl", prompts), ("department_sft.jsonl", sft)):
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        (HERE / name).write_text(text, encoding="utf-8")
    pairs = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in department_pairs())
    (HERE / "department_pairs.jsonl").write_text(pairs, encoding="utf-8")


if __name__ == "__main__":
    main()
