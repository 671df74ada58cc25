"""Generate data/sample/cmb/: a few multiple-choice questions in CMB's exam format, for the eval stage (data.exam),
written by hand for this project (stdlib only, deterministic: byte-identical on every run). Nothing here is from
CMB itself: only its record shape.

    python data/sample/cmb/make_cmb.py        (data/sample/make_sample.py runs it too)

writes

    cmb_exam.json   a JSON array as CMB ships its exams: {"exam_type", "exam_class", "exam_subject", "question",
                    "answer", "question_type", "option": {"A": ..., ...}}; 12 questions over three subjects (one
                    subject given only by its exam_class), two with several right answers, then a few malformed
                    records (listed in README.md with part of the reason the readers give)
    README.md       what is where, and the malformed records as JSON (tests read it)

General-practice knowledge for a training demo, not clinical advice.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
LETTERS = "ABCDE"
SINGLE, MULTIPLE = "单项选择题", "多项选择题"
CLINICAL = {"exam_type": "医师考试", "exam_class": "执业医师", "exam_subject": "临床执业医师"}
DENTAL = {"exam_type": "医师考试", "exam_class": "执业医师", "exam_subject": "口腔执业医师"}
NURSING = {"exam_type": "护理考试", "exam_class": "护士执业资格"}  # no exam_subject: the subject is the class

# (where, question, options, answer letters)
QUESTIONS: list[tuple[dict[str, str], str, list[str], str]] = [
    (CLINICAL, "患者，男，58岁。突发胸骨后压榨性疼痛2小时，含服硝酸甘油不缓解。为明确诊断，首先应做的检查是",
     ["心电图", "腹部B超", "胃镜", "肺功能", "头颅CT"], "A"),
    (CLINICAL, "根除幽门螺杆菌的四联疗法中不包括", ["质子泵抑制剂", "铋剂", "两种抗生素", "糖皮质激素"], "D"),
    (CLINICAL, "2型糖尿病患者，无禁忌证，首选的口服降糖药是",
     ["二甲双胍", "格列本脲", "阿卡波糖", "瑞格列奈", "罗格列酮"], "A"),
    (CLINICAL, "肾病综合征的诊断依据包括", ["大量蛋白尿", "低白蛋白血症", "高脂血症", "水肿", "肉眼血尿"], "ABCD"),
    (DENTAL, "龋病最主要的致病菌是", ["变形链球菌", "金黄色葡萄球菌", "大肠埃希菌", "白色念珠菌", "铜绿假单胞菌"], "A"),
    (DENTAL, "急性牙髓炎疼痛的特点是",
     ["自发性、阵发性疼痛", "以咬合痛为主", "患者能准确指出患牙", "冷热刺激不引起疼痛"], "A"),
    (DENTAL, "“六龄牙”是指", ["第一恒磨牙", "第二恒磨牙", "中切牙", "第一前磨牙"], "A"),
    (DENTAL, "预防龋病的有效措施有",
     ["使用含氟牙膏", "窝沟封闭", "减少含糖食物的摄入次数", "长期服用抗生素", "定期口腔检查"], "ABCE"),
    (NURSING, "为成人进行肌内注射，最常选用的部位是", ["臀大肌", "三角肌下缘", "腹直肌", "前臂屈侧"], "A"),
    (NURSING, "测量口腔温度时，体温计应放置的部位是", ["舌下热窝", "颊部", "上腭", "牙龈"], "A"),
    (NURSING, "长期卧床患者预防压力性损伤，一般至少每隔多长时间翻身一次", ["2小时", "6小时", "8小时", "12小时"], "A"),
    (NURSING, "静脉输液时发生空气栓塞，应立即协助患者采取的体位是",
     ["左侧卧位，头低足高", "右侧卧位", "半坐卧位", "俯卧位"], "A"),
]

_OPTS = dict(zip(LETTERS, ["休息", "手术", "输液", "观察"], strict=False))
# (record, why it is malformed): part of the reason the readers give
MALFORMED: list[tuple[dict, str]] = [
    ({**CLINICAL, "question": "没有给出答案的题目", "question_type": SINGLE, "option": _OPTS},
     "missing field 'answer'"),
    ({**CLINICAL, "exam_subject": 101, "question": "科目写成数字的题目", "answer": "A", "question_type": SINGLE,
      "option": _OPTS}, "field 'exam_subject' is a int, not a string"),
    ({**DENTAL, "question": "答案不在选项中的题目", "answer": "E", "question_type": SINGLE, "option": _OPTS},
     "answer E is not among the options ABCD"),
]


def records() -> tuple[list[dict], dict[str, str]]:
    """The array's records, and {element number (1-based): why it is malformed}."""
    out = [{**where, "question": question, "answer": answer, "question_type": MULTIPLE if len(answer) > 1 else SINGLE,
            "option": dict(zip(LETTERS, options, strict=False))} for where, question, options, answer in QUESTIONS]
    malformed = {}
    for record, why in MALFORMED:
        out.append(record)
        malformed[str(len(out))] = why
    return out, malformed


def readme(truth: dict) -> str:
    t = truth["cmb_exam.json"]
    fields = "exam_type, exam_class, exam_subject, question, answer, question_type, option"
    form = (f"a JSON array of `{{{fields}}}`; the nursing questions have no `exam_subject` (their subject is "
            "`exam_class`), two questions have several right answers; then malformed records")
    return f"""# data/sample/cmb: exam questions in CMB's format (data.exam)

Written by `make_cmb.py` in this folder (do not edit by hand; rerun it, or `data/sample/make_sample.py`). Questions
written for this project in the shape of CMB's exam files (none is CMB's), for a training demo, not clinical advice.
Read as the `exam` kind's `cmb` format; the eval stage reports its accuracy per subject (docs/data.md).

| file | records | malformed | format |
| --- | --- | --- | --- |
| cmb_exam.json | {t['records']} | {len(t['malformed'])} | {form} |

The malformed records (array element numbers) as JSON (tests read this block):

```json
{json.dumps(truth, ensure_ascii=False, indent=1)}
```
"""


def main(out: Path = HERE) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rows, malformed = records()
    (out / "cmb_exam.json").write_text(json.dumps(rows, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    truth = {"cmb_exam.json": {"records": len(rows), "malformed": malformed}}
    (out / "README.md").write_text(readme(truth), encoding="utf-8")
    return truth


if __name__ == "__main__":
    print(json.dumps(main(), ensure_ascii=False))
