"""Generate data/sample/formats/: one small file per source format that MedicalGPT's scripts read, with a few
deliberately malformed records (stdlib only, deterministic: byte-identical on every run).

    python data/sample/formats/make_formats.py

writes

    pretrain_medical.txt        plain text, one paragraph per line, UTF-8                   pt (kind pretrain)
    pretrain_gb18030.txt        the same format, GB18030-encoded                            pt (kind pretrain)
    sft_sharegpt_tools.jsonl    MedicalGPT ShareGPT with function_call/observation turns     sft
                                and "tools" (a JSON string in some records, a list in others)
    preference_sharegpt.jsonl   MedicalGPT DPO: ShareGPT prompt turns + "chosen"/"rejected"  rm, dpo, orpo
    grpo_qa.jsonl               MedicalGPT GRPO {"question", "answer"}, short answers        grpo (kind prompt)
    README.md                   what is where, and the malformed lines as JSON (tests read it)

and (re)writes the "formats/" section at the end of ../README.md (make_sample.py writes the rest of that
file: after running it, run this script again).

Every record is written here by hand or composed from the small tables below; the medical content is
plausible general-practice guidance for a training demo, not clinical advice. The only personal data are two
deliberately fake test strings (the well-known placeholder mobile number below) so that redaction shows.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAKE_PHONE = "13800138000"  # a placeholder number used in test data, not a real person's
SECTION_MARK = "<!-- formats/ section: written by formats/make_formats.py -->"


@dataclass(frozen=True)
class Line:
    """One line of a sample file: a record (dict) or raw text, and why it is malformed (None when it is not).
    `reason` is a part of the reason the readers give for quarantining the line."""

    payload: dict | str
    reason: str | None = None


def dump(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False)


def sharegpt(*turns: tuple[str, str]) -> list[dict]:
    return [{"from": f, "value": v} for f, v in turns]


# --------------------------------------------------------------------------------------------------
# Plain-text pretraining corpus
# --------------------------------------------------------------------------------------------------

CONDITIONS = [  # (name, what it is, main symptoms, what helps)
    ("高血压", "以体循环动脉压持续升高为特征的慢性病，诊室血压收缩压不低于140毫米汞柱或舒张压不低于90毫米汞柱即可诊断",
     "多数患者没有明显症状，部分人有头晕、头痛、颈项发紧或心悸",
     "限盐、控制体重、规律运动，并在医生指导下长期规律服用降压药"),
    ("2型糖尿病", "胰岛素分泌相对不足和胰岛素抵抗导致的慢性高血糖状态",
     "可有多饮、多尿、多食和体重下降，也有不少人仅在体检时发现血糖升高",
     "饮食控制、运动和血糖监测，必要时使用二甲双胍等降糖药"),
    ("缺铁性贫血", "体内储存铁不足、血红蛋白合成减少引起的小细胞低色素性贫血",
     "乏力、面色苍白、活动后心慌气短，严重时出现指甲变脆",
     "查明失血或吸收不良的原因，补充铁剂并多吃红肉、动物肝脏等富含铁的食物"),
    ("支气管哮喘", "以气道慢性炎症和气道高反应性为特征的常见呼吸系统疾病",
     "反复发作的喘息、气急、胸闷或咳嗽，夜间和清晨容易加重",
     "避免接触过敏原，规范使用吸入性糖皮质激素，随身携带缓解药物"),
    ("胃食管反流病", "胃内容物反流进入食管引起不适症状或并发症的疾病",
     "烧心、反酸，进食后或平卧时明显，有时伴胸骨后疼痛",
     "少食多餐、睡前三小时不进食、抬高床头，必要时使用质子泵抑制剂"),
    ("痛风", "嘌呤代谢紊乱、血尿酸升高导致尿酸盐结晶沉积引起的疾病",
     "常在夜间突发第一跖趾关节红肿热痛，疼痛剧烈",
     "急性期休息并在医生指导下抗炎止痛，缓解后长期控制血尿酸、少吃高嘌呤食物"),
    ("骨质疏松症", "骨量减少、骨微结构破坏导致骨脆性增加、容易骨折的全身性骨病",
     "早期常无症状，后期可有腰背痛、身高变矮或轻微外伤后骨折",
     "保证钙和维生素D摄入、坚持负重运动、预防跌倒，必要时抗骨质疏松治疗"),
    ("甲状腺功能减退症", "甲状腺激素合成或分泌不足引起的全身代谢减低综合征",
     "怕冷、乏力、嗜睡、体重增加、便秘，女性可有月经增多",
     "多数需要长期口服左甲状腺素钠，并定期复查甲状腺功能调整剂量"),
    ("慢性阻塞性肺疾病", "以持续气流受限为特征、与长期吸烟等有害颗粒暴露相关的慢性肺病",
     "慢性咳嗽、咳痰，活动后气短逐渐加重", "戒烟是最重要的措施，规律使用支气管舒张剂并进行肺康复锻炼"),
    ("带状疱疹", "潜伏在神经节内的水痘-带状疱疹病毒再激活引起的皮肤病",
     "沿一侧神经分布的成簇水疱，伴明显的烧灼样或针刺样疼痛",
     "尽早在发病三天内使用抗病毒药物，同时止痛，五十岁以上人群可考虑接种疫苗"),
    ("幽门螺杆菌感染", "定植于胃黏膜的细菌感染，与慢性胃炎、消化性溃疡和胃癌相关",
     "多数感染者没有症状，部分人有上腹不适、口臭或消化不良",
     "通过碳13或碳14尿素呼气试验检测，阳性者在医生指导下进行根除治疗"),
    ("过敏性鼻炎", "接触过敏原后由免疫球蛋白E介导的鼻黏膜非感染性炎症",
     "阵发性喷嚏、清水样鼻涕、鼻痒和鼻塞，常伴眼痒", "回避尘螨、花粉等过敏原，使用鼻用糖皮质激素或口服抗组胺药"),
]

EXAMS = [  # (examination, what it shows, how to prepare)
    ("空腹血糖", "反映基础状态下的血糖水平，正常参考范围约为3.9至6.1毫摩尔每升", "检查前需空腹8至12小时，可以少量饮水"),
    ("糖化血红蛋白", "反映近两到三个月的平均血糖水平，不少于6.5%可作为糖尿病诊断依据之一", "不需要空腹，随时可以抽血"),
    ("血常规", "了解红细胞、白细胞和血小板的数量，是判断贫血和感染的基础检查", "一般不需要空腹"),
    ("肝功能",
     "包括转氨酶、胆红素和白蛋白等指标，用于评估肝细胞损伤和肝脏合成功能",
     "建议空腹抽血，前一天避免饮酒和高脂饮食"),
    ("肾功能", "血肌酐和尿素氮反映肾小球滤过功能，可据此估算肾小球滤过率", "检查前一天避免剧烈运动和大量吃肉"),
    ("血脂四项",
     "包括总胆固醇、甘油三酯、高密度和低密度脂蛋白胆固醇，用于评估动脉粥样硬化风险",
     "需空腹12小时左右，前一晚清淡饮食"),
    ("甲状腺功能", "促甲状腺激素和游离甲状腺素用于判断甲状腺功能亢进或减退", "一般不需要空腹，正在服药者应告知医生"),
    ("心电图", "记录心脏电活动，用于发现心律失常和心肌缺血", "检查时平躺放松，不要说话或移动肢体"),
    ("胃镜", "直接观察食管、胃和十二指肠黏膜，可取活检明确诊断", "检查前禁食6至8小时，做无痛胃镜需有家属陪同"),
    ("腹部超声", "观察肝、胆、胰、脾、肾等腹部器官的形态和病变", "检查胆囊时需空腹8小时左右"),
    ("尿常规", "检查尿中的蛋白、红细胞、白细胞和葡萄糖等，用于筛查泌尿系统疾病和糖尿病", "最好留取清晨第一次中段尿"),
    ("骨密度", "双能X线骨密度检查用于诊断骨质疏松和评估骨折风险", "检查前去掉身上的金属物品"),
]


def pretrain_lines() -> list[Line]:
    lines: list[Line] = []
    for name, what, symptoms, care in CONDITIONS:
        lines.append(Line(f"{name}是{what}。了解它的特点，有助于早发现、早治疗，减少并发症的发生。"))
        lines.append(Line(f"{name}的常见表现：{symptoms}。出现这些情况时应及时到医院就诊，由医生结合检查结果明确诊断。"))
        lines.append(Line(f"{name}的日常管理：{care}。治疗方案因人而异，请勿自行增减药物，定期随访复查。"))
    lines.insert(7, Line(""))  # blank lines hold no record (skipped, not quarantined)
    lines.insert(20, Line("   "))
    return lines


def gb18030_lines() -> list[Line]:
    lines = [Line(f"{exam}：{shows}。检查前的准备：{prep}。结果需由医生结合症状综合判断。")
             for exam, shows, prep in EXAMS]
    lines.insert(5, Line(""))
    lines.append(Line("体检报告中的箭头只提示数值超出参考范围，并不等于患病；复查前请保持平常的饮食和作息。"))
    return lines


# --------------------------------------------------------------------------------------------------
# Tool-calling SFT (MedicalGPT ShareGPT: human, gpt, system, function_call, observation; "tools")
# --------------------------------------------------------------------------------------------------


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required}}


TOOLS = {
    "query_drug_info": _tool("query_drug_info", "查询药品说明书要点（适应症、常用剂量、禁忌、不良反应）",
                             {"drug_name": {"type": "string", "description": "药品通用名"}}, ["drug_name"]),
    "calculate_bmi": _tool("calculate_bmi", "根据身高体重计算体重指数BMI并给出中国成人分级",
                           {"height_cm": {"type": "number", "description": "身高（厘米）"},
                            "weight_kg": {"type": "number", "description": "体重（公斤）"}},
                           ["height_cm", "weight_kg"]),
    "check_drug_interaction": _tool("check_drug_interaction", "检查两种药物（或药物与酒精）之间的相互作用",
                                    {"drug_a": {"type": "string", "description": "药物A"},
                                     "drug_b": {"type": "string", "description": "药物B"}}, ["drug_a", "drug_b"]),
    "get_lab_reference": _tool("get_lab_reference", "查询检验项目的成人参考范围",
                               {"item": {"type": "string", "description": "检验项目名称"}}, ["item"]),
    "pediatric_dose": _tool("pediatric_dose", "按体重计算儿童常用退热药的单次剂量范围",
                            {"drug_name": {"type": "string", "description": "药品通用名"},
                             "weight_kg": {"type": "number", "description": "儿童体重（公斤）"}},
                            ["drug_name", "weight_kg"]),
    "book_appointment": _tool("book_appointment", "为患者预约门诊号",
                              {"department": {"type": "string", "description": "科室"},
                               "date": {"type": "string", "description": "日期，YYYY-MM-DD"},
                               "phone": {"type": "string", "description": "联系电话"}}, ["department", "date"]),
}

DRUGS = {  # name -> (indication, usual adult dose, contraindication, common adverse effects)
    "布洛芬": ("发热、轻中度疼痛", "每次0.2至0.4克，间隔4至6小时，非处方使用每日不超过1.2克",
             "活动性消化道溃疡或出血、严重心力衰竭", "胃肠不适，长期大量使用可损伤肾脏"),
    "对乙酰氨基酚": ("发热、轻中度疼痛", "每次0.5克，间隔4至6小时，非处方使用每日不超过2克",
               "严重肝功能不全", "常规剂量少见，过量可致严重肝损伤"),
    "二甲双胍": ("2型糖尿病", "起始每次0.5克、每日两次随餐，逐渐加量，每日最大2.55克",
             "估算肾小球滤过率低于30、严重感染或缺氧", "腹泻、恶心等胃肠道反应，长期使用可致维生素B12缺乏"),
    "氨氯地平": ("高血压、稳定型心绞痛",
        "每次5毫克、每日一次，最大10毫克",
        "对二氢吡啶类过敏",
        "踝部水肿、面部潮红、头痛"),
    "阿托伐他汀": ("高胆固醇血症、动脉粥样硬化性心血管病预防", "每次10至20毫克、每日一次，可按血脂调整",
               "活动性肝病、妊娠和哺乳期", "肌肉酸痛、转氨酶升高"),
    "奥美拉唑": ("胃食管反流病、消化性溃疡",
        "每次20毫克、每日一次，早餐前服用",
        "对本品过敏",
        "头痛、腹泻，长期使用注意低镁血症"),
    "阿莫西林": ("敏感菌引起的呼吸道、泌尿道感染", "每次0.5克、每6至8小时一次", "青霉素过敏", "皮疹、腹泻"),
    "氯雷他定": ("过敏性鼻炎、荨麻疹", "每次10毫克、每日一次", "对本品过敏", "少数人有乏力、口干"),
}

INTERACTIONS = {  # (a, b) -> (severity, effect, advice)
    ("华法林",
     "阿司匹林"): ("严重",
     "两药合用出血风险明显增加",
     "除非医生明确要求，否则避免合用，合用时密切监测出血和INR"),
    ("克拉霉素",
     "辛伐他汀"): ("禁忌",
     "克拉霉素抑制辛伐他汀代谢，横纹肌溶解风险显著增加",
     "禁止合用，需用克拉霉素时暂停辛伐他汀"),
    ("头孢曲松", "酒精"): ("严重", "可引起双硫仑样反应，出现面红、心悸、呼吸困难", "用药期间及停药后7天内不要饮酒"),
    ("西地那非", "硝酸甘油"): ("禁忌", "两药合用可致严重低血压", "禁止合用，服用西地那非后24小时内不得使用硝酸酯类"),
}

LABS = {
    "空腹血糖": "3.9-6.1 mmol/L", "糖化血红蛋白": "4.0%-6.0%", "血钾": "3.5-5.5 mmol/L",
    "血红蛋白": "男性130-175 g/L，女性115-150 g/L", "总胆固醇": "<5.2 mmol/L",
}

PEDIATRIC = {  # drug -> (mg/kg low, mg/kg high, interval)
    "对乙酰氨基酚": (10, 15, "间隔4至6小时，24小时内不超过4次"),
    "布洛芬": (5, 10, "间隔6至8小时，24小时内不超过4次"),
}

SYSTEM_TOOLS = "你是一名医院智能助手，可以调用工具查询药品、检验和预约信息。回答要准确、简洁，必要时提醒患者就医。"
SYSTEM_DOCTOR = "你是一名耐心细致的全科医生，用通俗易懂的语言回答患者的问题。"


def call(name: str, **arguments: object) -> str:
    return dump({"name": name, "arguments": arguments})


def tools_field(names: list[str], as_string: bool) -> str | list[dict]:
    tools = [TOOLS[n] for n in names]
    return dump(tools) if as_string else tools


def bmi_of(height_cm: float, weight_kg: float) -> tuple[float, str]:
    bmi = round(weight_kg / (height_cm / 100) ** 2, 1)
    grade = "偏瘦" if bmi < 18.5 else "正常" if bmi < 24 else "超重" if bmi < 28 else "肥胖"
    return bmi, grade


def sft_tool_lines() -> list[Line]:
    out: list[Line] = []
    n = 0  # alternate "tools" between a JSON string and a list

    def add(turns: list[dict], names: list[str] | None, system: bool = False) -> None:
        nonlocal n
        record: dict = {"conversations": ([{"from": "system", "value": SYSTEM_TOOLS}] if system else []) + turns}
        if names is not None:
            record["tools"] = tools_field(names, as_string=n % 2 == 0)
            n += 1
        out.append(Line(record))

    questions = {
        "布洛芬": "布洛芬一次吃多少？有什么要注意的？",
        "对乙酰氨基酚": "扑热息痛就是对乙酰氨基酚吗？成人怎么吃？",
        "二甲双胍": "医生给我开了二甲双胍，这个药怎么吃，有什么副作用？",
        "氨氯地平": "吃氨氯地平以后脚踝有点肿，正常吗？",
        "阿托伐他汀": "阿托伐他汀是降什么的？吃了会伤肝吗？",
        "奥美拉唑": "奥美拉唑饭前吃还是饭后吃？",
        "阿莫西林": "嗓子发炎能自己买阿莫西林吃吗？",
        "氯雷他定": "过敏性鼻炎吃氯雷他定，一天吃几次？",
    }
    for i, (drug, question) in enumerate(questions.items()):
        indication, dose, contra, adverse = DRUGS[drug]
        result = {"drug_name": drug, "indication": indication, "dosage": dose, "contraindications": contra,
                  "adverse_effects": adverse}
        answer = (f"{drug}主要用于{indication}。常用成人用法：{dose}。以下情况不宜使用：{contra}。"
                  f"常见不良反应有{adverse}。具体用量请遵医嘱或咨询药师。")
        add(sharegpt(("human", question), ("function_call", call("query_drug_info", drug_name=drug)),
                     ("observation", dump(result)), ("gpt", answer)),
            ["query_drug_info", "check_drug_interaction"], system=i % 3 == 0)

    for height, weight in [(175, 70), (160, 48), (168, 80), (158, 72)]:
        bmi, grade = bmi_of(height, weight)
        add(sharegpt(("human", f"我身高{height}厘米，体重{weight}公斤，帮我算算胖不胖。"),
                     ("function_call", call("calculate_bmi", height_cm=height, weight_kg=weight)),
                     ("observation", dump({"bmi": bmi, "category": grade, "normal_range": "18.5-23.9"})),
                     ("gpt", f"您的BMI为{bmi}，按中国成人标准属于“{grade}”（正常范围18.5至23.9）。"
                             + ("请继续保持均衡饮食和规律运动。" if grade == "正常" else
                                "建议在医生或营养师指导下调整饮食和运动，逐步把体重控制到正常范围。"))),
            ["calculate_bmi"])

    for (a, b), (severity, effect, advice) in INTERACTIONS.items():
        add(sharegpt(("human", f"{a}和{b}能一起用吗？"),
                     ("function_call", call("check_drug_interaction", drug_a=a, drug_b=b)),
                     ("observation", dump({"severity": severity, "effect": effect, "advice": advice})),
                     ("gpt", f"不建议自行合用。{effect}（相互作用等级：{severity}）。{advice}。"
                             "如已同时使用，请尽快咨询医生。")),
            ["check_drug_interaction", "query_drug_info"], system=a == "华法林")

    for item, ref in LABS.items():
        add(sharegpt(("human", f"{item}的正常值是多少？"),
                     ("function_call", call("get_lab_reference", item=item)),
                     ("observation", dump({"item": item, "reference": ref, "note": "不同实验室略有差异"})),
                     ("gpt", f"成人{item}的参考范围是{ref}，不同医院的实验室可能略有差异，"
                             "请以化验单上标注的范围为准。")),
            ["get_lab_reference"])

    # a clarifying question first, then the call
    drug, (low, high, interval) = "对乙酰氨基酚", PEDIATRIC["对乙酰氨基酚"]
    add(sharegpt(("human", "孩子发烧38.8度，对乙酰氨基酚混悬液该喂多少？"),
                 ("gpt", "请告诉我孩子现在的体重，儿童退热药需要按体重计算剂量。"),
                 ("human", "16公斤。"),
                 ("function_call", call("pediatric_dose", drug_name=drug, weight_kg=16)),
                 ("observation", dump({"single_dose_mg": [low * 16, high * 16], "interval": interval})),
                 ("gpt", f"按每公斤{low}至{high}毫克计算，16公斤的孩子单次剂量为{low * 16}至{high * 16}毫克，"
                         f"{interval}。"
                         "请按混悬液说明书的浓度换算成毫升，用配套量具喂药；如果持续高热超过三天或精神差，请及时就医。")),
        ["pediatric_dose", "query_drug_info"], system=True)

    # two calls at once (a list), one observation with both results
    parallel = dump([{"name": "query_drug_info", "arguments": {"drug_name": "布洛芬"}},
                     {"name": "query_drug_info", "arguments": {"drug_name": "对乙酰氨基酚"}}])
    add(sharegpt(("human", "布洛芬和对乙酰氨基酚有什么区别？"), ("function_call", parallel),
                 ("observation", dump([{"drug_name": "布洛芬", "indication": DRUGS["布洛芬"][0],
                                        "type": "非甾体抗炎药"},
                                       {"drug_name": "对乙酰氨基酚", "indication": DRUGS["对乙酰氨基酚"][0],
                                        "type": "解热镇痛药，几乎没有抗炎作用"}])),
                 ("gpt", "两者都能退热止痛。布洛芬属于非甾体抗炎药，还有抗炎作用，但对胃和肾的影响更大；"
                         "对乙酰氨基酚对胃刺激小，但过量容易伤肝。两药不要同时重复服用。")),
        ["query_drug_info"])

    # "arguments" given as a JSON string (readers canonicalise it into an object)
    add(sharegpt(("human", "帮我查一下奥美拉唑的禁忌。"),
                 ("function_call", dump({"name": "query_drug_info", "arguments": dump({"drug_name": "奥美拉唑"})})),
                 ("observation", dump({"drug_name": "奥美拉唑", "contraindications": DRUGS["奥美拉唑"][2]})),
                 ("gpt", "奥美拉唑的主要禁忌是对本品过敏。长期服用需在医生指导下进行，并注意监测血镁。")),
        ["query_drug_info"])

    # a fake test phone number (so that redaction shows), in the user turn and in the call's arguments
    add(sharegpt(("human", f"帮我约下周一（2026-12-07）的心内科门诊，电话{FAKE_PHONE}。"),
                 ("function_call", call("book_appointment", department="心内科", date="2026-12-07", phone=FAKE_PHONE)),
                 ("observation", dump({"status": "success", "number": "A023", "time": "2026-12-07 09:30"})),
                 ("gpt", "已为您预约2026年12月7日上午9:30心内科门诊，就诊序号A023。"
                         "请携带既往病历和正在服用的药物清单按时就诊。")),
        ["book_appointment"], system=True)

    # a call that the assistant declines: tools offered, none used
    add(sharegpt(("human", "能帮我开点安眠药寄到家里吗？"),
                 ("gpt", "抱歉，我不能开具或邮寄处方药。长期失眠建议到睡眠门诊或精神心理科就诊，由医生评估后用药。")),
        ["query_drug_info", "book_appointment"])

    # plain ShareGPT records: no tools, an empty tools list, or no "tools" key at all
    plain = [
        ("感冒了要不要吃抗生素？",
         "普通感冒多由病毒引起，抗生素无效。多休息、多喝水，发热或咽痛明显时可对症用药，症状加重请就医。"),
        ("体检发现尿酸偏高，需要吃药吗？",
         "单纯尿酸轻度升高而没有痛风发作，一般先调整生活方式：少吃动物内脏和海鲜、不喝啤酒、多喝水，并定期复查。"),
        ("晚上总是睡不着怎么办？",
         "保持规律作息，睡前一小时不看手机，下午以后不喝咖啡和浓茶。如果失眠超过一个月并影响白天状态，建议就诊。"),
        ("最近老是口腔溃疡，是缺什么维生素吗？",
         "反复口腔溃疡与免疫、压力、睡眠不足等有关，不一定缺维生素。若溃疡超过两周不愈合，应到口腔科检查。"),
    ]
    for i, (q, a) in enumerate(plain):
        turns = sharegpt(("human", q), ("gpt", a))
        if i == 0:
            out.append(Line({"conversations": turns}))
        elif i == 1:
            out.append(Line({"conversations": turns, "tools": "[]"}))
        elif i == 2:
            out.append(Line({"conversations": [{"from": "system", "value": SYSTEM_DOCTOR}] + turns, "tools": []}))
        else:
            more = sharegpt(("human", "需要做什么检查？"), ("gpt", "一般先做口腔检查，必要时查血常规和微量元素。"))
            out.append(Line({"conversations": turns + more}))

    bad = [
        Line({"conversations": sharegpt(("human", "查一下布洛芬。"), ("function_call", "query_drug_info(布洛芬)"),
                                        ("observation", "{}"), ("gpt", "已查询。")),
              "tools": tools_field(["query_drug_info"], True)},
             "turn 2: function_call is not a JSON {name, arguments} object"),
        Line({"conversations": sharegpt(("human", "空腹血糖正常值？"),
                                        ("observation", dump({"reference": LABS["空腹血糖"]})),
                                        ("gpt", "3.9至6.1毫摩尔每升。")),
              "tools": tools_field(["get_lab_reference"], False)},
             "turn 2: a tool turn must directly follow a tool_call turn"),
        Line({"conversations": sharegpt(("human", "血钾正常值是多少？"),
                                        ("function_call", call("get_lab_reference", item="血钾")),
                                        ("observation", dump({"reference": LABS["血钾"]}))),
              "tools": tools_field(["get_lab_reference"], True)},
             "conversation must end with an assistant turn, ends with tool"),
        Line({"conversations": sharegpt(("human", "帮我算BMI，170厘米，65公斤。"),
                                        ("function_call", call("calculate_bmi", height_cm=170, weight_kg=65)),
                                        ("gpt", "您的BMI约为22.5。")), "tools": tools_field(["calculate_bmi"], False)},
             "turn 2: a tool_call turn must be followed by a tool turn"),
        Line({"conversations": sharegpt(("human", "阿莫西林怎么吃？"), ("gpt", "请遵医嘱。")),
              "tools": dump(TOOLS["query_drug_info"])},  # an object, not a list
             "field 'tools' is not a JSON list of objects"),
        Line('{"conversations": [{"from": "human", "value": "氯雷他定能长期吃吗？"}, '
             '{"from": "gpt", "value": "可以在医生指导下',
             "invalid JSON"),
    ]
    for position, line in zip([3, 9, 14, 20, 26, 31], bad, strict=True):
        out.insert(position, line)
    return out


# --------------------------------------------------------------------------------------------------
# Preference (MedicalGPT DPO: ShareGPT prompt turns, plain-string chosen/rejected, optional system, tools)
# --------------------------------------------------------------------------------------------------

PREFERENCE = [  # (question, chosen, rejected)
    ("发烧39度，家里有退烧药，需要马上去医院吗？",
     "成人发热39℃可先服用布洛芬或对乙酰氨基酚退热，多喝水、注意休息。如果高热超过三天、伴有剧烈头痛、呼吸困难、意识不清或皮疹，应立即就医。",
     "发烧是小事，吃点抗生素就好了。"),
    ("胸口压榨样疼痛20分钟了，还出冷汗，怎么办？",
     "这可能是急性心肌梗死的表现，请立即拨打120，停止活动、保持安静，不要自己开车去医院。有条件时在医生电话指导下嚼服阿司匹林。",
     "可能是胃不舒服，喝点热水躺一会儿看看。"),
    ("高血压吃药一段时间血压正常了，可以停药吗？",
     "不建议自行停药。血压正常往往是药物在起作用，擅自停药可能导致血压反弹甚至诱发心脑血管意外。是否减量应由医生根据长期监测结果决定。",
     "血压正常了就说明病好了，可以停药。"),
    ("孩子误吞了一颗纽扣电池，怎么办？",
     "纽扣电池可在数小时内灼伤食道，请立即带孩子去最近的急诊，不要催吐，也不要等待观察。路上可以告诉医生吞入的时间和电池型号。",
     "让孩子多吃点韭菜，过两天就拉出来了。"),
    ("糖尿病人能吃水果吗？",
     "血糖控制平稳时可以适量吃水果，选择苹果、梨、柚子等升糖较慢的品种，放在两餐之间，每天约200克，并相应减少主食。",
     "糖尿病人绝对不能吃任何水果。"),
    ("被狗咬破了皮，需要打狂犬疫苗吗？",
     "皮肤被咬破属于需要处置的暴露。请立即用肥皂水和流动清水交替冲洗伤口至少15分钟，再用碘伏消毒，并尽快到犬伤门诊接种狂犬病疫苗，必要时注射免疫球蛋白。",
     "自家狗打过疫苗就不用管，贴个创可贴就行。"),
    ("头孢吃完第二天能喝酒吗？",
     "不能。服用头孢类抗生素期间及停药后至少7天内都应避免饮酒，否则可能出现双硫仑样反应，表现为面红、心悸、胸闷甚至休克。",
     "隔一天就没事了，少喝点可以。"),
    ("最近总是口渴、尿多，体重还下降了，是怎么回事？",
     "多饮、多尿、体重下降是糖尿病的典型表现，建议尽快到内分泌科检查空腹血糖、餐后血糖和糖化血红蛋白，以明确诊断。",
     "天气热多喝水很正常，不用在意。"),
    ("幽门螺杆菌阳性一定要治疗吗？",
     "一般建议根除治疗，尤其是有胃溃疡、胃癌家族史或长期服用阿司匹林的人。根除方案通常为含铋剂的四联疗法，疗程10至14天，结束后至少4周复查呼气试验。",
     "吃点酸奶就能把幽门螺杆菌杀掉。"),
    ("孕妇感冒了可以吃药吗？",
     "孕期感冒以休息、多喝水为主。如需退热，对乙酰氨基酚相对安全，但应在医生指导下短期使用；避免自行服用复方感冒药和抗生素。",
     "孕妇吃什么药都会导致胎儿畸形，只能硬扛。"),
    ("血脂高吃了他汀，需要复查什么？",
     "开始服用他汀后4至6周应复查血脂、转氨酶和肌酸激酶，评估疗效和安全性；如有不明原因的肌肉酸痛，要及时告诉医生。",
     "他汀吃上就行，不用复查。"),
    ("老人摔倒后髋部疼，不能站立，怎么办？",
     "需高度怀疑髋部骨折。不要强行搀扶站立或行走，让老人保持平卧，拨打120送医，到医院拍片明确诊断。",
     "揉一揉、贴个膏药，休息几天就好了。"),
]

PREFERENCE_MULTI = [  # (first question, first answer, follow-up, chosen, rejected)
    ("我有过敏性鼻炎，每年春天都犯。", "春季发作多与花粉过敏有关，可以在花粉季节前开始预防用药。", "具体用什么药？",
     "可以规律使用鼻用糖皮质激素喷雾，症状明显时加用氯雷他定等第二代抗组胺药。外出戴口罩，回家后洗脸、清洗鼻腔。",
     "多吃点消炎药就好了。"),
    ("体检发现转氨酶轻度升高。", "转氨酶轻度升高常见于脂肪肝、饮酒、药物或病毒性肝炎等。", "我平时喝酒比较多，怎么办？",
     "首先要戒酒，并在1至3个月后复查肝功能；同时做腹部超声和乙肝、丙肝筛查，排除其他原因。超重者需减重。",
     "转氨酶高一点没关系，继续喝也行。"),
    ("我妈妈最近记性越来越差。",
     "记忆力下降可能与年龄、睡眠、情绪、甲状腺功能或维生素B12缺乏等有关，也可能是认知障碍早期表现。",
     "需要去哪个科看？",
     "建议到神经内科或记忆门诊就诊，医生会做认知评估、血液检查和头颅影像学检查，明确原因后再制定治疗方案。",
     "老了都这样，不用看。"),
]


def preference_lines() -> list[Line]:
    out: list[Line] = []
    for i, (q, chosen, rejected) in enumerate(PREFERENCE):
        prompt = sharegpt(("human", q))
        if i % 3 == 1:
            prompt = sharegpt(("system", SYSTEM_DOCTOR)) + prompt
        out.append(Line({"conversations": prompt, "chosen": chosen, "rejected": rejected}))
    for q1, a1, q2, chosen, rejected in PREFERENCE_MULTI:
        out.append(Line({"conversations": sharegpt(("human", q1), ("gpt", a1), ("human", q2)),
                         "chosen": chosen, "rejected": rejected}))

    # tool calling: the prompt ends with the observation, chosen uses it well, rejected does not
    for i, drug in enumerate(["二甲双胍", "阿莫西林", "阿托伐他汀"]):
        indication, dose, contra, adverse = DRUGS[drug]
        prompt = sharegpt(("human", f"{drug}的用法和禁忌是什么？"),
                          ("function_call", call("query_drug_info", drug_name=drug)),
                          ("observation", dump({"drug_name": drug, "dosage": dose, "contraindications": contra,
                                                "adverse_effects": adverse})))
        if i == 0:
            prompt = sharegpt(("system", SYSTEM_TOOLS)) + prompt
        out.append(Line({"conversations": prompt, "tools": tools_field(["query_drug_info"], as_string=i != 1),
                         "chosen": f"{drug}常用成人用法：{dose}。禁忌：{contra}。常见不良反应：{adverse}。"
                                   "请遵医嘱用药。",
                         "rejected": f"{drug}随便吃，没什么禁忌。"}))
    for i, ((a, b), (severity, effect, advice)) in enumerate(list(INTERACTIONS.items())[:2]):
        prompt = sharegpt(("human", f"我在吃{a}，还能吃{b}吗？"),
                          ("function_call", call("check_drug_interaction", drug_a=a, drug_b=b)),
                          ("observation", dump({"severity": severity, "effect": effect, "advice": advice})))
        out.append(Line({"conversations": prompt, "tools": tools_field(["check_drug_interaction"], as_string=i == 0),
                         "chosen": f"不建议自行合用：{effect}。{advice}。请先咨询开药的医生。",
                         "rejected": f"{a}和{b}可以放心一起吃。"}))
    out.append(Line({"conversations": sharegpt(("human", f"帮我预约明天的皮肤科，我的电话是{FAKE_PHONE}。")),
                     "tools": tools_field(["book_appointment"], as_string=True),
                     "chosen": "好的，请问您希望预约上午还是下午？确认后我为您提交预约。",
                     "rejected": "预约不了，你自己去医院排队吧。"}))
    # LLaMA-Factory's form: chosen/rejected as turn objects
    out.append(Line({"conversations": sharegpt(("human", "痛风急性发作时能喝酒吗？")),
                     "chosen": {"from": "gpt", "value": "不能。酒精尤其是啤酒会升高血尿酸、诱发或加重痛风发作，"
                                                        "急性期应严格戒酒并多喝水。"},
                     "rejected": {"from": "gpt", "value": "喝点白酒活血，对痛风有好处。"}}))
    out.append(Line({"conversations": sharegpt(("human", "骨质疏松要补钙，吃多少合适？")),
                     "chosen": {"role": "assistant", "content": "成人每日钙推荐摄入量约800毫克，50岁以上约1000毫克，"
                                                                 "优先从牛奶、豆制品中获取，"
                                                                 "不足时再补充钙剂，并同时保证维生素D。"},
                     "rejected": {"role": "assistant", "content": "钙片吃得越多越好。"}}))

    bad = [
        Line({"conversations": sharegpt(("human", "咳嗽两周了怎么办？"), ("gpt", "建议拍胸片。")),
              "chosen": "咳嗽超过两周应到呼吸科就诊，必要时拍胸片排除肺炎和结核。", "rejected": "多喝热水。"},
             "prompt must end with a user turn, ends with assistant"),
        Line({"conversations": sharegpt(("human", "便秘怎么办？")),
              "chosen": "多吃蔬菜，多喝水。", "rejected": "多吃蔬菜，多喝水。"},
             "chosen and rejected responses are identical"),
        Line({"conversations": sharegpt(("human", "牙龈出血是怎么回事？")),
              "chosen": "多与牙龈炎有关，建议到口腔科洁牙。"},
             "missing field 'rejected'"),
        Line({"conversations": sharegpt(("human", "头晕怎么办？"), ("system", SYSTEM_DOCTOR)),
              "chosen": "先测量血压和血糖，反复头晕请到神经内科就诊。", "rejected": "睡一觉就好。"},
             "turn 2: a system turn is only allowed first"),
        Line('{"conversations": [{"from": "human", "value": "腰疼怎么办？"}], "chosen": "先休息", "rejected": ',
             "invalid JSON"),
    ]
    for position, line in zip([2, 8, 13, 19, 24], bad, strict=True):
        out.insert(position, line)
    return out


# --------------------------------------------------------------------------------------------------
# Unpaired (KTO: one completion per prompt, labelled desirable or not)
# --------------------------------------------------------------------------------------------------

UNPAIRED_EXTRA = [  # (question, completion, label): answers judged on their own, not against a pair
    ("感冒了需要吃抗生素吗？",
     "普通感冒多由病毒引起，抗生素无效，以休息、多喝水和对症处理为主；出现高热不退或咳脓痰时再就医评估。", True),
    ("感冒了需要吃抗生素吗？", "感冒就要吃头孢，好得快。", False),
    ("晚上总是睡不着怎么办？",
     "保持规律作息，睡前一小时不看手机，避免咖啡和浓茶；失眠持续超过一个月或影响白天工作，请到睡眠门诊就诊。", True),
    ("晚上总是睡不着怎么办？", "每晚喝点酒就能睡着了。", False),
    ("小孩发烧38.5度，怎么处理？",
     "可按体重给予对乙酰氨基酚或布洛芬退热，多喝水、减少衣物；"
     "若精神差、抽搐、持续高热超过三天或不足三个月的婴儿发热，应立即就医。", True),
    ("小孩发烧38.5度，怎么处理？", "用酒精给孩子全身擦浴降温最快。", False),
]


def unpaired_lines() -> list[Line]:
    """ShareGPT prompt turns + completion + label (most records), TRL's {prompt, completion, label} with a string
    or conversational prompt, and a label given as 1/0."""
    out: list[Line] = []
    for i, (q, chosen, rejected) in enumerate(PREFERENCE):
        desirable = i % 2 == 0
        prompt = sharegpt(("human", q))
        if i % 4 == 1:
            prompt = sharegpt(("system", SYSTEM_DOCTOR)) + prompt
        out.append(Line({"conversations": prompt, "completion": chosen if desirable else rejected,
                         "label": desirable}))
    for q1, a1, q2, chosen, _ in PREFERENCE_MULTI:
        out.append(Line({"conversations": sharegpt(("human", q1), ("gpt", a1), ("human", q2)),
                         "completion": chosen, "label": True}))
    for i, (q, completion, label) in enumerate(UNPAIRED_EXTRA):
        if i % 3 == 0:  # TRL's conversational form
            out.append(Line({"prompt": [{"role": "user", "content": q}],
                             "completion": [{"role": "assistant", "content": completion}], "label": label}))
        elif i % 3 == 1:  # TRL's plain form, the label as 1/0
            out.append(Line({"prompt": q, "completion": completion, "label": int(label)}))
        else:
            out.append(Line({"conversations": [{"role": "user", "content": q}], "completion": completion,
                             "label": label}))
    bad = [
        Line({"conversations": sharegpt(("human", "手脚冰凉是怎么回事？")),
              "completion": "多与末梢循环差有关，注意保暖。"},
             "missing field 'label'"),
        Line({"conversations": sharegpt(("human", "口腔溃疡反复发作怎么办？")),
              "completion": "多吃蔬菜水果，必要时就医。", "label": "yes"},
             "field 'label' is a str, not a boolean"),
        Line({"conversations": sharegpt(("human", "咳嗽两周了怎么办？"), ("gpt", "建议拍胸片。")),
              "completion": "咳嗽超过两周应到呼吸科就诊。", "label": True},
             "prompt must end with a user turn, ends with assistant"),
        Line({"prompt": "眼睛干涩怎么办？", "completion": "  ", "label": False}, "empty field 'completion'"),
        Line('{"conversations": [{"from": "human", "value": "腰疼怎么办？"}], "completion": "先休息", "label": ',
             "invalid JSON"),
    ]
    for position, line in zip([3, 8, 12, 17, 21], bad, strict=True):
        out.insert(position, line)
    return out


# --------------------------------------------------------------------------------------------------
# GRPO (MedicalGPT {"question", "answer"}, short reference answers)
# --------------------------------------------------------------------------------------------------

CHOICE = [  # (question with options, letter)
    ("以下哪种药物属于血管紧张素转换酶抑制剂？A. 氨氯地平 B. 依那普利 C. 美托洛尔 D. 氢氯噻嗪", "B"),
    ("维生素D缺乏在儿童中主要引起哪种疾病？A. 夜盲症 B. 佝偻病 C. 坏血病 D. 脚气病", "B"),
    ("维生素C严重缺乏可导致：A. 夜盲症 B. 佝偻病 C. 坏血病 D. 脚气病", "C"),
    ("维生素A缺乏的早期表现是：A. 夜盲症 B. 佝偻病 C. 坏血病 D. 脚气病", "A"),
    ("维生素B1缺乏可导致：A. 夜盲症 B. 佝偻病 C. 坏血病 D. 脚气病", "D"),
    ("缺铁性贫血的典型血象是：A. 小细胞低色素性 B. 大细胞性 C. 正细胞正色素性 D. 溶血性", "A"),
    ("痛风与哪种物质代谢异常有关？A. 葡萄糖 B. 胆固醇 C. 尿酸 D. 胆红素", "C"),
    ("原发性甲状腺功能亢进时通常降低的是：A. 游离T4 B. 游离T3 C. 促甲状腺激素 D. 心率", "C"),
    ("肺结核的主要传播途径是：A. 消化道 B. 呼吸道飞沫 C. 血液 D. 皮肤接触", "B"),
    ("高钾血症的典型心电图改变是：A. T波高尖 B. 出现U波 C. ST段压低 D. QT间期延长", "A"),
    ("怀疑急性心肌梗死时，最先应完成的检查是：A. 胃镜 B. 腹部超声 C. 头颅CT D. 心电图", "D"),
    ("常用于检测幽门螺杆菌的无创方法是：A. 尿素呼气试验 B. 胃镜活检 C. 结肠镜 D. 腹部CT", "A"),
    ("青霉素过敏的患者应避免使用：A. 阿莫西林 B. 阿奇霉素 C. 左氧氟沙星 D. 甲硝唑", "A"),
    ("二甲双胍最常见的不良反应是：A. 低血糖 B. 胃肠道反应 C. 水肿 D. 体重增加", "B"),
]

NUMERIC = [  # (question, short answer)
    ("生理盐水中氯化钠的质量浓度是多少？", "0.9%"),
    ("糖化血红蛋白达到多少可作为诊断糖尿病的标准之一？", "6.5%"),
    ("成人心肺复苏时胸外按压与人工通气的比例是多少？", "30:2"),
    ("成人空腹血糖正常参考范围的上限是多少mmol/L？", "6.1"),
    ("诊室血压收缩压达到多少mmHg可诊断高血压（未用药、非同日三次）？", "140"),
    ("身高175厘米、体重70公斤的成人，BMI是多少（保留一位小数）？", "22.9"),
    ("体重20公斤的儿童，对乙酰氨基酚单次最大剂量按15mg/kg计算是多少毫克？", "300"),
    ("中国成人BMI正常范围的下限是多少？", "18.5"),
    ("高锰酸钾溶液坐浴常用的稀释比例是多少？", "1:5000"),
    ("血钾正常参考范围的下限是多少mmol/L？", "3.5"),
    ("足月妊娠是指孕满多少周？", "37"),
    ("新生儿Apgar评分的满分是多少分？", "10"),
]


def grpo_lines() -> list[Line]:
    out = [Line({"system": "请只回答选项字母。", "question": q, "answer": a} if i % 5 == 3
                else {"question": q, "answer": a}) for i, (q, a) in enumerate(CHOICE)]
    out += [Line({"question": q, "answer": a}) for q, a in NUMERIC]
    # a number as the answer: read as the text "4"
    out.append(Line({"question": "1克碳水化合物在体内完全氧化约产生多少千卡能量？", "answer": 4}))
    bad = [
        Line({"question": "成人正常静息心率的上限是每分钟多少次？"}, "missing field 'answer'"),
        Line({"question": "  ", "answer": "B"}, "empty field 'question'"),
        Line({"question": "以下哪些属于糖尿病典型症状？A. 多饮 B. 多尿 C. 发热 D. 体重下降", "answer": ["A", "B", "D"]},
             "field 'answer' is a list, not a string"),
        Line('{"question": "胸外按压的深度是多少厘米？", "answer": "5-6"', "invalid JSON"),
    ]
    for position, line in zip([4, 11, 18, 25], bad, strict=True):
        out.insert(position, line)
    return out


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------

FILES = {  # file -> (builder, encoding, description, used by)
    "pretrain_medical.txt": (pretrain_lines, "utf-8", "plain text, one paragraph per line (UTF-8)", "pt"),
    "pretrain_gb18030.txt": (gb18030_lines, "gb18030", "plain text, one paragraph per line (GB18030)", "pt"),
    "sft_sharegpt_tools.jsonl": (sft_tool_lines, "utf-8", "MedicalGPT ShareGPT with function_call/observation and "
                                 "`tools` (JSON string or list), plus plain records", "sft"),
    "preference_sharegpt.jsonl": (preference_lines, "utf-8", "MedicalGPT DPO: ShareGPT prompt turns, `chosen`/"
                                  "`rejected` (some with a system turn, some with tools)", "rm, dpo, orpo"),
    "grpo_qa.jsonl": (grpo_lines, "utf-8", "MedicalGPT GRPO `{question, answer}`, short answers", "grpo"),
    "unpaired_kto.jsonl": (unpaired_lines, "utf-8", "KTO unpaired examples: ShareGPT prompt turns + `completion` + "
                           "`label`, and TRL's `{prompt, completion, label}`", "kto"),
}


def text_of(line: Line) -> str:
    if isinstance(line.payload, str):
        return line.payload
    return dump(line.payload)


def manifest(built: dict[str, list[Line]]) -> dict:
    """Per file: source records (non-blank lines) and the malformed ones by physical line number."""
    out = {}
    for name, lines in built.items():
        records = [i for i, line in enumerate(lines, 1) if text_of(line).strip()]
        out[name] = {"records": len(records),
                     "malformed": {str(i): line.reason for i, line in enumerate(lines, 1) if line.reason}}
    return out


def readme(facts: dict) -> str:
    rows = [f"| {name} | {FILES[name][3]} | {f['records']} | {len(f['malformed'])} | {FILES[name][2]} |"
            for name, f in facts.items()]
    return "\n".join([
        "# data/sample/formats: one file per source format MedicalGPT reads",
        "",
        "Written by `make_formats.py` in this folder (do not edit by hand; rerun it). Synthetic Chinese medical",
        "content for a demo, not medical advice. Each file holds a few deliberately malformed records (listed below",
        "with part of the reason the readers give); every other record must load. `.txt` files have no",
        "malformed records (any line is valid text; blank lines are skipped); the GB18030 file is the",
        "encoding check.",
        "",
        "| file | used by | records | malformed | format |",
        "| --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"The only personal data are two deliberately fake test strings (placeholder mobile {FAKE_PHONE}),",
        "one in sft_sharegpt_tools.jsonl (user turn and tool-call arguments) and one in",
        "preference_sharegpt.jsonl, so that PII redaction shows.",
        "",
        "The malformed lines as JSON (tests read this block):",
        "",
        "```json",
        json.dumps(facts, ensure_ascii=False, indent=1),
        "```",
        "",
    ])


def sample_readme_section(facts: dict) -> str:
    """The section that closes ../README.md (appended after what make_sample.py writes)."""
    total = sum(f["records"] for f in facts.values())
    bad = sum(len(f["malformed"]) for f in facts.values())
    return "\n".join([
        SECTION_MARK,
        "",
        "## formats/: every source format MedicalGPT's scripts read",
        "",
        f"`formats/` ({total} records in {len(facts)} files, {bad} of them deliberately malformed) has one small",
        "file per format beyond the ones above, written by `formats/make_formats.py` (run it after",
        "`make_sample.py`: it rewrites this section):",
        "",
        "- `pretrain_medical.txt`, `pretrain_gb18030.txt`: plain-text pretraining corpora, one paragraph per line",
        "  (MedicalGPT loads `.txt` as the `text` dataset), UTF-8 and GB18030.",
        "- `sft_sharegpt_tools.jsonl`: ShareGPT tool calling, `from` in human, gpt, system, function_call,",
        "  observation, with `tools` as a JSON string or a list.",
        "- `preference_sharegpt.jsonl`: MedicalGPT's DPO format,",
        "  `{\"conversations\": [...], \"chosen\", \"rejected\"}`,",
        "  with system turns, multi-turn prompts, tool calls and LLaMA-Factory's turn-object answers.",
        "- `grpo_qa.jsonl`: GRPO `{\"question\", \"answer\"}` with short reference answers (kind `prompt`).",
        "- `unpaired_kto.jsonl`: KTO's unpaired examples (kind `unpaired`), `{\"conversations\", \"completion\",",
        "  \"label\"}` and TRL's `{\"prompt\", \"completion\", \"label\"}` (string or conversational prompt).",
        "",
        "`formats/README.md` lists the malformed line of each file and why the readers reject it.",
        "",
    ])


def write_sample_readme_section(readme_path: Path, facts: dict) -> None:
    if not readme_path.is_file():
        return
    text = readme_path.read_text(encoding="utf-8")
    text = text.split(SECTION_MARK, 1)[0].rstrip("\n") + "\n\n"
    readme_path.write_text(text + sample_readme_section(facts), encoding="utf-8")


def main(out: Path = HERE, sample_readme: Path | None = HERE.parent / "README.md") -> dict:
    """Write every file under `out`; with `sample_readme`, also rewrite that file's formats/ section."""
    out.mkdir(parents=True, exist_ok=True)
    built = {name: builder() for name, (builder, _, _, _) in FILES.items()}
    for name, lines in built.items():
        encoding = FILES[name][1]
        (out / name).write_bytes("".join(text_of(line) + "\n" for line in lines).encode(encoding))
    facts = manifest(built)
    (out / "README.md").write_text(readme(facts), encoding="utf-8")
    if sample_readme is not None:
        write_sample_readme_section(sample_readme, facts)
    return facts


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="output folder (default: this script's folder)")
    args = parser.parse_args()
    result = main(args.out, HERE.parent / "README.md" if args.out == HERE else None)
    print(json.dumps({name: [f["records"], len(f["malformed"])] for name, f in result.items()}, ensure_ascii=False))
