"""Generate data/sample/exam/: a small multiple-choice medical exam for the eval stage (data.exam), written by hand
for this project (stdlib only, deterministic: byte-identical on every run).

    python data/sample/exam/make_exam.py

writes

    medical_mc.jsonl   48 questions in the common exam shape {"question", "options", "answer"}: options as an
                       object {"A": ...} (most) or a list (every fifth), answers one letter or several ("AC")
    ceval_style.jsonl  C-Eval's columns {"id", "question", "A", "B", "C", "D", "answer", "explanation"}, and a few
                       deliberately malformed lines (listed in README.md with part of the reason the readers give)
    README.md          what is where, and the malformed lines as JSON (tests read it)

General-practice knowledge for a training demo, not clinical advice.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
LETTERS = "ABCDE"

# (question, options, answer letters)
QUESTIONS: list[tuple[str, list[str], str]] = [
    ("成人高血压的诊断标准是诊室血压达到多少？",
     ["≥140/90 mmHg", "≥120/80 mmHg", "≥160/100 mmHg", "≥130/70 mmHg"], "A"),
    ("2型糖尿病首选的口服降糖药通常是哪一种？", ["格列本脲", "二甲双胍", "胰岛素", "阿卡波糖"], "B"),
    ("缺铁性贫血最常见的原因是什么？", ["维生素C过多", "慢性失血", "叶酸过量", "运动过多"], "B"),
    ("心肌梗死最特异的血清标志物是？", ["肌钙蛋白", "血糖", "血钾", "尿酸"], "A"),
    ("维生素D缺乏在儿童中主要引起哪种疾病？", ["坏血病", "夜盲症", "佝偻病", "脚气病"], "C"),
    ("维生素C严重缺乏可引起哪种疾病？", ["佝偻病", "坏血病", "糙皮病", "夜盲症"], "B"),
    ("维生素A缺乏的早期表现是？", ["夜盲症", "牙龈出血", "口角炎", "骨痛"], "A"),
    ("甲状腺功能亢进症患者常见的表现是？", ["怕冷、体重增加", "心悸、多汗、体重下降", "便秘、嗜睡", "心率减慢"], "B"),
    ("急性阑尾炎早期腹痛常开始于哪个部位？", ["右下腹", "上腹部或脐周", "左下腹", "腰背部"], "B"),
    ("胃溃疡最主要的致病因素之一是？", ["幽门螺杆菌感染", "病毒性肝炎", "缺钙", "高血压"], "A"),
    ("乙型肝炎的主要传播途径不包括？", ["母婴传播", "血液传播", "性接触传播", "日常握手"], "D"),
    ("肺结核最常见的症状是？", ["长期咳嗽、低热、盗汗", "突发剧烈胸痛", "下肢水肿", "皮肤瘙痒"], "A"),
    ("支气管哮喘急性发作时首选的缓解药物是？", ["吸入短效β2受体激动剂", "口服抗生素", "静脉补钾", "口服维生素"], "A"),
    ("慢性阻塞性肺疾病最重要的危险因素是？", ["吸烟", "饮茶", "久坐", "高盐饮食"], "A"),
    ("脑卒中后需要尽快就医的典型表现是？", ["口角歪斜、一侧肢体无力", "轻微鼻塞", "皮肤干燥", "食欲增加"], "A"),
    ("成人正常空腹血糖的范围大约是？",
     ["3.9～6.1 mmol/L", "7.0～11.1 mmol/L", "1.0～2.5 mmol/L", "12～15 mmol/L"], "A"),
    ("诊断糖尿病的空腹血糖标准是？", ["≥5.6 mmol/L", "≥6.1 mmol/L", "≥7.0 mmol/L", "≥11.1 mmol/L"], "C"),
    ("痛风与下列哪种物质在体内升高有关？", ["尿酸", "胆红素", "肌酐", "血钙"], "A"),
    ("青霉素最严重的不良反应是？", ["过敏性休克", "脱发", "失眠", "便秘"], "A"),
    ("阿司匹林长期服用最常见的不良反应是？", ["胃肠道出血", "低血糖", "高血钾", "听力增强"], "A"),
    ("成人心肺复苏时胸外按压的频率是每分钟多少次？", ["60～80次", "100～120次", "140～160次", "40～50次"], "B"),
    ("成人心肺复苏胸外按压的深度约为？", ["1～2厘米", "5～6厘米", "8～10厘米", "越浅越好"], "B"),
    ("流行性感冒的病原体是？", ["细菌", "流感病毒", "真菌", "寄生虫"], "B"),
    ("手足口病多见于哪类人群？", ["老年人", "5岁以下儿童", "孕妇", "运动员"], "B"),
    ("预防麻疹最有效的措施是？", ["接种麻疹疫苗", "多喝热水", "服用抗生素", "补充钙剂"], "A"),
    ("新生儿生理性黄疸通常在出生后几天出现？", ["当天", "2～3天", "2周以后", "1个月以后"], "B"),
    ("妊娠期糖尿病筛查常用的检查是？", ["口服葡萄糖耐量试验", "胸部X线", "脑电图", "骨密度"], "A"),
    ("骨质疏松症最常见的严重后果是？", ["骨折", "发热", "咳嗽", "皮疹"], "A"),
    ("类风湿关节炎最常累及的关节是？", ["手足小关节", "颅骨", "肋骨", "脊髓"], "A"),
    ("急性胰腺炎最常见的病因之一是？", ["胆道结石", "近视", "贫血", "湿疹"], "A"),
    ("肝硬化最常见的并发症之一是？", ["上消化道出血", "近视", "龋齿", "中耳炎"], "A"),
    ("慢性肾脏病患者饮食上通常应注意？", ["控制蛋白质和盐的摄入", "大量补充蛋白粉", "多吃高钾水果", "不限制饮水"], "A"),
    ("尿路感染最常见的致病菌是？", ["大肠埃希菌", "结核分枝杆菌", "流感病毒", "白色念珠菌"], "A"),
    ("低血糖发作时清醒的患者应首先？", ["口服含糖食物或饮料", "立即运动", "注射胰岛素", "服用降压药"], "A"),
    ("体重指数（BMI）的计算方法是？", ["体重(kg)÷身高(m)的平方", "身高÷体重", "体重×身高", "腰围÷臀围"], "A"),
    ("中国成人BMI达到多少属于肥胖？", ["≥18.5", "≥24", "≥28", "≥35"], "C"),
    ("带状疱疹的病原体是？", ["水痘-带状疱疹病毒", "乙肝病毒", "金黄色葡萄球菌", "疟原虫"], "A"),
    ("缺碘最容易引起哪种疾病？", ["地方性甲状腺肿", "糖尿病", "哮喘", "痛风"], "A"),
    ("抑郁症的核心症状是？", ["持续情绪低落、兴趣减退", "食欲亢进且精力旺盛", "血压升高", "视力下降"], "A"),
    ("帕金森病的典型表现是？", ["静止性震颤", "高热惊厥", "皮肤黄染", "尿频尿急"], "A"),
    ("癫痫大发作时旁人正确的做法是？", ["让患者侧卧并移开周围硬物", "往嘴里塞毛巾", "用力按住四肢", "喂水"], "A"),
    ("烧伤后现场首先应做的处理是？", ["用流动冷水冲洗降温", "涂抹牙膏", "立即挑破水疱", "用热水冲洗"], "A"),
    ("鼻出血时正确的处理是？", ["身体前倾、捏住鼻翼压迫", "仰头向后", "平躺并抬高下肢", "用力擤鼻"], "A"),
    ("下列哪种药物属于质子泵抑制剂？", ["奥美拉唑", "布洛芬", "阿莫西林", "硝苯地平"], "A"),
    # several right answers
    ("高血压患者生活方式干预包括哪些？", ["减少钠盐摄入", "规律运动", "大量饮酒", "控制体重"], "ABD"),
    ("糖尿病的典型症状包括哪些？", ["多饮", "多尿", "体重增加", "多食"], "ABD"),
    ("下列哪些属于脑卒中的危险因素？", ["高血压", "吸烟", "规律运动", "心房颤动"], "ABD"),
    ("预防流感的有效措施有哪些？", ["接种流感疫苗", "勤洗手", "滥用抗生素", "流行季节戴口罩"], "ABD"),
]

CEVAL = [  # C-Eval's columns: id, question, A-D, answer, explanation
    ("链球菌感染后最常引起的肾脏疾病是？",
     ["急性肾小球肾炎", "肾结石", "多囊肾", "肾癌"], "A", "感染后免疫反应累及肾小球。"),
    ("成人每日食盐摄入量建议不超过？", ["5克", "15克", "20克", "30克"], "A", "膳食指南建议每天不超过5克。"),
    ("用于治疗过敏性鼻炎的常用药物是？", ["氯雷他定", "胰岛素", "华法林", "地高辛"], "A", "氯雷他定为抗组胺药。"),
    ("急性心肌梗死患者到院后应尽快进行的检查是？",
     ["心电图", "胃镜", "骨密度", "视力检查"], "A", "心电图可在数分钟内完成。"),
]

# (record, why it is malformed): part of the reason the readers give
MALFORMED: list[tuple[dict | str, str]] = [
    ({"question": "高血压的首选检查是？", "options": {"A": "血压测量", "B": "胃镜"}, "answer": "C"},
     "answer C is not among the options AB"),
    ({"question": "下列哪项是维生素？", "answer": "A"}, "missing field 'options'"),
    ({"question": "只有一个选项的题目？", "options": ["唯一选项"], "answer": "A"},
     "a multiple-choice question needs at least 2"),
    ({"question": "", "options": ["是", "否"], "answer": "A"}, "empty field 'question'"),
    ({"question": "答案不是字母的题目？", "options": ["是", "否"], "answer": "是"}, "is not option letters"),
    ({"question": "选项跳过了字母？", "options": {"A": "甲", "C": "丙"},
     "answer": "A"}, "not A.. in order without a gap"),
    ('{"question": "截断的行", "options": ["甲", ', "invalid JSON"),
]


def dump(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False)


def exam_lines() -> list[str]:
    out = []
    for i, (question, options, answer) in enumerate(QUESTIONS):
        opts: list[str] | dict[str, str] = options if i % 5 == 4 else dict(zip(LETTERS, options, strict=False))
        out.append(dump({"question": question, "options": opts, "answer": answer}))
    return out


def ceval_lines() -> tuple[list[str], dict[str, str]]:
    lines = [dump({"id": i, "question": q, **dict(zip(LETTERS, opts, strict=False)), "answer": a, "explanation": e})
             for i, (q, opts, a, e) in enumerate(CEVAL)]
    malformed = {}
    for record, why in MALFORMED:
        lines.append(record if isinstance(record, str) else dump(record))
        malformed[str(len(lines))] = why
    return lines, malformed


def readme(truth: dict) -> str:
    mc, ce = truth["medical_mc.jsonl"], truth["ceval_style.jsonl"]
    mc_format = "options an object or a list, answers one letter or several (`ABD`)"
    ceval_columns, ce_format = "id, question, A, B, C, D, answer, explanation", "then malformed lines"
    return f"""# data/sample/exam: a multiple-choice medical exam (data.exam)

Written by `make_exam.py` in this folder (do not edit by hand; rerun it). General-practice questions written for
this project, for a training demo, not clinical advice. The eval stage scores every model of a run on them by the
log-likelihood of each option and by the letter it generates (docs/stages.md: the eval stage).

| file | records | malformed | format |
| --- | --- | --- | --- |
| medical_mc.jsonl | {mc['records']} | 0 | `{{question, options, answer}}`: {mc_format} |
| ceval_style.jsonl | {ce['records']} | {len(ce['malformed'])} | C-Eval's columns `{{{ceval_columns}}}`, {ce_format} |

The malformed lines as JSON (tests read this block):

```json
{json.dumps(truth, ensure_ascii=False, indent=1)}
```
"""


def main(out: Path = HERE) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    mc = exam_lines()
    ceval, malformed = ceval_lines()
    (out / "medical_mc.jsonl").write_text("\n".join(mc) + "\n", encoding="utf-8")
    (out / "ceval_style.jsonl").write_text("\n".join(ceval) + "\n", encoding="utf-8")
    truth = {"medical_mc.jsonl": {"records": len(mc), "malformed": {}},
             "ceval_style.jsonl": {"records": len(ceval), "malformed": malformed}}
    (out / "README.md").write_text(readme(truth), encoding="utf-8")
    return truth


if __name__ == "__main__":
    print(json.dumps(main(), ensure_ascii=False))
