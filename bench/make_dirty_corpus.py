"""Generate a large synthetic DIRTY medical dialogue corpus (MedicalGPT ShareGPT JSONL) for the cleaning benchmark.

    python bench/make_dirty_corpus.py --records 1000000 --out /tmp/dirty_1m.jsonl [--seed 0]

Each line is `{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}`
(one or two rounds), except the malformed ones. Stdlib only, seeded (`random.Random(seed)`: the same
--records and --seed give the same bytes on any machine and Python process), and streaming: lines are
written one by one and only a ring buffer of the last 4,096 records is kept (for duplicates), so memory stays
bounded at any --records. Progress goes to stderr every 100,000 records; a JSON summary of the actual counts
per category goes to stdout at the end.

Mix (each record draws its category independently; expected rates):

    malformed    0.1%  a line that is not valid JSON: a truncated record, a Python-repr dict (single
                       quotes), a trailing comma, or a bare text line
    exact_dup    5%    a byte-identical copy of one of the last 4,096 records
    near_dup     5%    a copy of one of the last 4,096 records with 1-3 characters changed (replaced,
                       deleted or inserted) in its longest message
    pii          3%    a normal exchange whose patient message carries synthetic PII: an 18-digit resident ID
                       (real province prefix, real birth date, valid GB 11643 checksum, X upper/lower case),
                       a mobile number (13812345678, 138-1234-5678, 138 1234 5678, +86/0086 forms), an email
                       glued to Chinese text (请发到zhang88@qq.com谢谢), and/or a Luhn-valid 16-19 digit
                       bank card (grouped by 4 or not)
    low_info     3%    the doctor's answer is a non-answer (嗯, 好的, 谢谢, ...)
    signoff      3%    a normal answer that ends with a stock sign-off (感谢您的咨询，祝您身体健康！...)
    normal       rest  a doctor-patient exchange composed from templates and a vocabulary of conditions,
                       symptoms, exams, drugs with doses and frequencies, ages, durations, lab values and
                       blood pressures; many sentences are optional or shuffled, so every normal record differs
                       and similar records still share many n-grams (near-dup detection has real work)

Normal records also carry clinical numbers that a PII filter must leave alone: doses (0.5g), lab values
(空腹血糖7.8mmol/L), blood pressures (150/95mmHg), dates, drug approval numbers (国药准字H20xxxxxx) and
service numbers (120, 12320).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, deque
from pathlib import Path
from typing import TextIO

RATES = {"malformed": 0.001, "exact_dup": 0.05, "near_dup": 0.05, "pii": 0.03, "low_info": 0.03, "signoff": 0.03}
CATEGORIES = (*RATES, "normal")
RECENT = 4096  # ring buffer of recent records, the pool duplicates are drawn from
PROGRESS_EVERY = 100_000

# --------------------------------------------------------------------------------------------------------------
# vocabulary
# --------------------------------------------------------------------------------------------------------------

# name, department, symptoms, exams, drugs (name, dose, frequency), advice
CONDITIONS = [
    ("高血压", "心内科", ["头晕", "头痛", "后颈部发紧", "心慌", "耳鸣", "视物模糊"],
     ["24小时动态血压监测", "心电图", "肾功能", "心脏彩超"],
     [("氨氯地平", "5mg", "每日1次"), ("缬沙坦", "80mg", "每日1次"), ("美托洛尔缓释片", "47.5mg", "每日1次"),
      ("吲达帕胺", "1.5mg", "每日1次")],
     ["低盐饮食，每天盐不超过5g", "规律测量血压并记录", "戒烟限酒", "控制体重"]),
    ("2型糖尿病", "内分泌科", ["口干", "多饮", "多尿", "体重下降", "乏力", "手脚麻木"],
     ["空腹血糖", "糖化血红蛋白", "口服葡萄糖耐量试验", "尿微量白蛋白"],
     [("二甲双胍", "0.5g", "每日3次"), ("阿卡波糖", "50mg", "每日3次随餐"), ("格列美脲", "2mg", "每日1次"),
      ("达格列净", "10mg", "每日1次")],
     ["控制主食量，少吃甜食", "每天快走30分钟", "定期监测血糖", "注意足部护理"]),
    ("急性上呼吸道感染", "呼吸科", ["咽痛", "流鼻涕", "鼻塞", "低热", "咳嗽", "打喷嚏"],
     ["血常规", "C反应蛋白", "咽拭子"],
     [("对乙酰氨基酚", "0.5g", "发热时服用，间隔不少于4小时"), ("连花清瘟胶囊", "4粒", "每日3次"),
      ("氯雷他定", "10mg", "每日1次")],
     ["多喝温水", "注意休息", "保持室内通风", "体温超过38.5℃再用退热药"]),
    ("社区获得性肺炎", "呼吸科", ["发热", "咳嗽", "咳黄痰", "胸痛", "气促", "寒战"],
     ["胸部CT", "血常规", "降钙素原", "痰培养"],
     [("阿莫西林克拉维酸钾", "0.625g", "每日3次"), ("莫西沙星", "0.4g", "每日1次"), ("氨溴索", "30mg", "每日3次")],
     ["卧床休息", "多饮水", "按疗程用药，不要自行停药", "3天无好转需复诊"]),
    ("慢性胃炎", "消化科", ["上腹痛", "腹胀", "反酸", "嗳气", "食欲不振", "恶心"],
     ["胃镜", "碳13呼气试验", "腹部B超"],
     [("奥美拉唑", "20mg", "每日2次，饭前半小时"), ("铝碳酸镁", "1g", "每日3次嚼服"), ("莫沙必利", "5mg", "每日3次")],
     ["少食多餐", "避免辛辣刺激", "戒烟戒酒", "晚饭不要吃太饱"]),
    ("胃食管反流病", "消化科", ["烧心", "反酸", "胸骨后疼痛", "咽部异物感", "夜间咳嗽"],
     ["胃镜", "24小时食管pH监测"],
     [("雷贝拉唑", "10mg", "每日1次"), ("泮托拉唑", "40mg", "每日1次，早餐前"), ("铝碳酸镁", "1g", "每日3次")],
     ["睡前3小时不进食", "床头抬高15厘米", "减少咖啡和浓茶", "减轻体重"]),
    ("湿疹", "皮肤科", ["皮肤瘙痒", "红斑", "丘疹", "皮肤干燥脱皮", "渗液"],
     ["过敏原检测", "血清总IgE"],
     [("丁酸氢化可的松乳膏", "薄涂", "每日2次"), ("氯雷他定", "10mg", "每日1次"),
      ("炉甘石洗剂", "适量外用", "每日3次")],
     ["洗澡水温不要太高", "勤用保湿霜", "穿纯棉衣物", "避免搔抓"]),
    ("偏头痛", "神经内科", ["单侧搏动性头痛", "畏光", "恶心", "呕吐", "怕吵"],
     ["头颅核磁共振", "脑电图"],
     [("布洛芬", "0.3g", "疼痛时服用，每日不超过2次"), ("佐米曲普坦", "2.5mg", "发作时服用"),
      ("氟桂利嗪", "5mg", "每晚1次")],
     ["规律作息", "记录头痛日记", "避免熬夜和饮酒", "减少巧克力和奶酪"]),
    ("腰椎间盘突出症", "骨科", ["腰痛", "下肢放射痛", "腿麻", "久坐后加重", "弯腰困难"],
     ["腰椎核磁共振", "腰椎CT", "肌电图"],
     [("塞来昔布", "200mg", "每日1次"), ("甲钴胺", "0.5mg", "每日3次"), ("乙哌立松", "50mg", "每日3次")],
     ["睡硬板床", "避免久坐和弯腰搬重物", "急性期卧床休息", "疼痛缓解后做核心肌群锻炼"]),
    ("缺铁性贫血", "血液科", ["乏力", "头晕", "面色苍白", "心慌", "指甲变脆"],
     ["血常规", "血清铁蛋白", "大便潜血"],
     [("多糖铁复合物", "150mg", "每日1次"), ("琥珀酸亚铁", "0.1g", "每日3次"), ("维生素C", "100mg", "每日3次")],
     ["多吃红肉和动物肝脏", "铁剂不要和浓茶同服", "查明失血原因", "一个月后复查血常规"]),
    ("甲状腺功能亢进症", "内分泌科", ["心慌", "怕热", "多汗", "手抖", "体重下降", "易怒"],
     ["甲状腺功能", "甲状腺彩超", "TRAb"],
     [("甲巯咪唑", "10mg", "每日3次"), ("普萘洛尔", "10mg", "每日3次")],
     ["忌碘饮食", "避免劳累", "每月复查甲功和血常规", "出现发热咽痛立即就诊"]),
    ("冠心病", "心内科", ["胸闷", "活动后胸痛", "气短", "左肩放射痛", "出冷汗"],
     ["心电图", "冠脉CTA", "心肌酶", "运动平板试验"],
     [("阿司匹林肠溶片", "100mg", "每日1次"), ("阿托伐他汀", "20mg", "每晚1次"), ("单硝酸异山梨酯", "20mg", "每日2次")],
     ["胸痛持续不缓解立即拨打120", "戒烟", "低脂饮食", "随身携带硝酸甘油"]),
    ("泌尿系感染", "泌尿外科", ["尿频", "尿急", "尿痛", "下腹坠胀", "尿液浑浊"],
     ["尿常规", "尿培养", "泌尿系B超"],
     [("左氧氟沙星", "0.5g", "每日1次"), ("磷霉素氨丁三醇", "3g", "单次口服"), ("头孢克肟", "0.1g", "每日2次")],
     ["多喝水勤排尿", "注意个人卫生", "不要憋尿", "疗程结束后复查尿常规"]),
    ("痛风", "风湿免疫科", ["第一跖趾关节红肿", "关节剧痛", "夜间疼醒", "局部发热"],
     ["血尿酸", "关节彩超", "双能CT"],
     [("秋水仙碱", "0.5mg", "每日2次"), ("非布司他", "20mg", "每日1次"), ("依托考昔", "120mg", "每日1次")],
     ["少吃海鲜和动物内脏", "不喝啤酒", "每天饮水2000ml以上", "急性期不要开始降尿酸"]),
    ("小儿急性腹泻", "儿科", ["稀水样便", "腹痛", "呕吐", "发热", "精神差"],
     ["大便常规", "轮状病毒抗原", "电解质"],
     [("口服补液盐Ⅲ", "按体重冲服", "少量多次"), ("蒙脱石散", "1袋", "每日3次"),
      ("枯草杆菌二联活菌颗粒", "1袋", "每日2次")],
     ["继续母乳或清淡饮食", "观察尿量", "出现嗜睡或尿少及时就医", "注意手卫生"]),
    ("过敏性鼻炎", "耳鼻喉科", ["打喷嚏", "清水样鼻涕", "鼻痒", "鼻塞", "眼痒"],
     ["过敏原检测", "鼻内镜"],
     [("糠酸莫米松鼻喷雾剂", "每侧2喷", "每日1次"), ("氯雷他定", "10mg", "每日1次"), ("孟鲁司特", "10mg", "每晚1次")],
     ["避开过敏原", "外出戴口罩", "用生理盐水洗鼻", "喷鼻剂要坚持用"]),
    ("焦虑障碍", "精神心理科", ["紧张不安", "失眠", "心慌", "坐立不安", "注意力不集中"],
     ["焦虑量表评估", "甲状腺功能", "心电图"],
     [("舍曲林", "50mg", "每日1次"), ("丁螺环酮", "5mg", "每日3次")],
     ["规律作息", "适当运动", "可以配合心理治疗", "不要自行加减药量"]),
    ("支气管哮喘", "呼吸科", ["喘息", "胸闷", "夜间咳嗽", "呼气困难", "运动后气喘"],
     ["肺功能", "支气管舒张试验", "呼出气一氧化氮"],
     [("布地奈德福莫特罗吸入剂", "1吸", "每日2次"), ("沙丁胺醇气雾剂", "1-2喷", "喘息时使用"),
      ("孟鲁司特", "10mg", "每晚1次")],
     ["吸药后漱口", "随身带急救气雾剂", "避免冷空气和烟雾", "定期复查肺功能"]),
    ("骨质疏松症", "骨科", ["腰背痛", "身高变矮", "驼背", "轻微外伤后骨折"],
     ["骨密度", "血钙", "25羟维生素D"],
     [("碳酸钙D3片", "600mg", "每日1次"), ("阿仑膦酸钠", "70mg", "每周1次，空腹"), ("骨化三醇", "0.25μg", "每日1次")],
     ["多晒太阳", "适量负重运动", "防跌倒", "补充奶制品"]),
    ("带状疱疹", "皮肤科", ["单侧带状分布的水疱", "皮肤刺痛", "烧灼感", "局部红斑"],
     ["血常规", "疱液检查"],
     [("伐昔洛韦", "0.3g", "每日2次"), ("加巴喷丁", "0.3g", "每晚1次"), ("甲钴胺", "0.5mg", "每日3次")],
     ["不要弄破水疱", "保持皮肤清洁干燥", "尽早抗病毒治疗", "注意休息"]),
]

# who, sex (None: either), age range
PATIENTS = [("我", None, (16, 80)), ("我妈妈", "女", (40, 88)), ("我爸爸", "男", (40, 90)), ("我老公", "男", (22, 75)),
            ("我老婆", "女", (22, 75)), ("孩子", None, (1, 14)), ("我奶奶", "女", (60, 98)), ("我爷爷", "男", (60, 98)),
            ("我女儿", "女", (1, 30)), ("我儿子", "男", (1, 30)), ("我同事", None, (20, 60)), ("宝宝", None, (1, 3))]
DURATIONS = ["{n}天", "{n}周", "{n}个多月", "半个月", "{n}年", "最近{n}天", "大概{n}周"]
ONSETS = ["", "受凉后", "熬夜后", "吃了火锅以后", "劳累后", "换季的时候", "生气后", "没有明显诱因"]
OPENERS = ["医生你好，", "您好，", "大夫，", "医生，", "你好医生，", "", "请问一下，", "麻烦问下，"]
QUESTIONS = ["请问这是怎么回事？", "需要做什么检查？", "应该吃什么药？", "严重吗？", "需要去医院吗？",
             "平时要注意什么？", "这个药可以长期吃吗？", "挂什么科比较好？", "会不会是{cond}？", "能治好吗？"]
HISTORY = ["有{cond}病史{n}年", "以前没有什么病", "有高血压，一直吃药控制", "对青霉素过敏", "去年做过阑尾手术",
           "家里人有糖尿病", "平时抽烟，一天{n}支", "喝酒比较多"]
FINDINGS = ["血压{sbp}/{dbp}mmHg", "空腹血糖{glu}mmol/L", "体温{temp}℃", "心率{hr}次/分",
            "血红蛋白{hb}g/L", "尿酸{ua}μmol/L", "白细胞{wbc}×10^9/L", "糖化血红蛋白{a1c}%"]
FOLLOWUPS = ["那需要吃多久？", "有没有副作用？", "饮食上要注意什么？", "多久复查一次？", "可以喝酒吗？",
             "孕妇能用吗？", "吃了药还是不好怎么办？", "可以同时吃{drug}吗？"]
ANSWER_OPENERS = ["你好，", "您好，", "", "根据你的描述，", "从描述来看，", "结合您提供的情况，"]
DIAGNOSES = ["考虑{cond}的可能性比较大", "初步考虑是{cond}", "要警惕{cond}", "像是{cond}的表现",
             "不能排除{cond}"]
EXAM_ADVICE = ["建议到{dept}就诊，做{exam}", "最好先查一下{exam}和{exam2}", "需要完善{exam}检查",
               "可以先去{dept}做个{exam}"]
DRUG_ADVICE = ["可以在医生指导下服用{drug}，每次{dose}，{freq}", "可以用{drug}{dose}，{freq}",
               "目前可以先用{drug}，每次{dose}，{freq}，连续{days}天", "{drug}一次{dose}，{freq}"]
WARNINGS = ["如果症状加重或者出现{sym2}，请及时就医", "服药期间注意观察有没有不良反应",
            "出现胸痛、呼吸困难等情况请立即拨打120", "有问题可以拨打卫生热线12320咨询",
            "用药前请仔细阅读说明书", "{days}天后复诊"]
DRUG_FACTS = ["这个药的批准文号是国药准字H{approval}，是正规药品", "药盒上生产日期是{year}年{month}月{day}日",
              "批号{batch}的药可以放心用", "{year}年{month}月的检查结果可以带上"]
FOLLOWUP_ANSWERS = ["一般需要{days}天一个疗程，症状好转后再巩固几天", "常见副作用有胃肠道不适，饭后服用可以减轻",
                    "饮食清淡，少油少盐，多吃蔬菜水果", "建议{weeks}周后复查", "用药期间不建议饮酒",
                    "孕期用药要非常谨慎，需要在产科医生指导下使用", "效果不好的话要复诊调整方案"]

LOW_INFO = ["嗯", "好的", "谢谢", "嗯嗯", "好", "知道了", "哦", "收到", "好的好的", "嗯。", "谢谢医生", "可以"]
SIGNOFFS = ["感谢您的咨询，祝您身体健康！", "感谢您的信任，祝您早日康复！", "以上建议仅供参考，祝您健康！",
            "希望我的回答对您有帮助，祝您生活愉快！", "如有其他问题欢迎随时咨询，祝您健康！",
            "感谢您的咨询，祝早日康复。"]

# GB 11643: province codes (first two digits) of mainland provinces, municipalities and autonomous regions.
PROVINCES = ["11", "12", "13", "14", "15", "21", "22", "23", "31", "32", "33", "34", "35", "36", "37", "41", "42",
             "43", "44", "45", "46", "50", "51", "52", "53", "54", "61", "62", "63", "64", "65"]
ID_WEIGHTS = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2]
ID_CHECK = "10X98765432"
MOBILE_PREFIXES = ["130", "131", "132", "133", "135", "136", "137", "138", "139", "150", "151", "152", "155", "157",
                   "158", "159", "166", "170", "176", "177", "180", "181", "182", "183", "186", "187", "188", "189",
                   "191", "198", "199"]
EMAIL_DOMAINS = ["qq.com", "163.com", "126.com", "sina.com", "gmail.com", "hotmail.com", "foxmail.com", "139.com"]
PINYIN = ["zhang", "wang", "li", "liu", "chen", "yang", "zhao", "huang", "zhou", "wu", "xu", "sun", "ma", "hu"]
MUTATION_CHARS = "的了是在有不这就都也和人我他你们到说要会着看好病药医生痛热咳疼吃"

# --------------------------------------------------------------------------------------------------------------
# synthetic PII
# --------------------------------------------------------------------------------------------------------------


def id_check_digit(first17: str) -> str:
    """GB 11643-1999 check character of the first 17 digits."""
    return ID_CHECK[sum(int(c) * w for c, w in zip(first17, ID_WEIGHTS, strict=True)) % 11]


def resident_id(rng: random.Random) -> str:
    year = rng.randint(1935, 2020)
    month = rng.randint(1, 12)
    day = rng.randint(1, 28 if month == 2 else 30)
    first17 = (f"{rng.choice(PROVINCES)}{rng.randint(1, 20):02d}{rng.randint(1, 30):02d}"
               f"{year}{month:02d}{day:02d}{rng.randint(0, 999):03d}")
    check = id_check_digit(first17)
    return first17 + (check.lower() if check == "X" and rng.random() < 0.3 else check)


def mobile(rng: random.Random) -> str:
    p, a, b = rng.choice(MOBILE_PREFIXES), f"{rng.randint(0, 9999):04d}", f"{rng.randint(0, 9999):04d}"
    return rng.choice([f"{p}{a}{b}", f"{p}-{a}-{b}", f"{p} {a} {b}", f"+86 {p}{a}{b}", f"+86-{p}-{a}-{b}",
                       f"0086{p}{a}{b}"])


def luhn_check_digit(payload: str) -> str:
    total = 0
    for i, c in enumerate(reversed(payload)):
        d = int(c)
        if i % 2 == 0:  # doubled: these sit at odd positions from the right once the check digit is appended
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return str((10 - total % 10) % 10)


def bank_card(rng: random.Random) -> str:
    length = rng.choice([16, 16, 19, 19, 17, 18])
    payload = rng.choice(["62", "622", "4", "5"])
    payload += "".join(str(rng.randint(0, 9)) for _ in range(length - 1 - len(payload)))
    card = payload + luhn_check_digit(payload)
    if rng.random() < 0.4:
        card = " ".join(card[i:i + 4] for i in range(0, len(card), 4))
    return card


def email(rng: random.Random) -> str:
    user = rng.choice(PINYIN) + rng.choice(["", ".", "_"]) + rng.choice(PINYIN) + str(rng.randint(1, 9999))
    return f"{user}@{rng.choice(EMAIL_DOMAINS)}"


def pii_sentence(rng: random.Random) -> str:
    parts = []
    kinds = rng.sample(["id", "phone", "email", "card"], rng.randint(1, 3))
    for k in kinds:
        if k == "id":
            parts.append(rng.choice(["我的身份证号是{v}", "身份证{v}", "患者身份证号码：{v}", "证件号{v}"])
                         .format(v=resident_id(rng)))
        elif k == "phone":
            parts.append(rng.choice(["我的电话是{v}", "手机{v}", "联系电话：{v}", "打我电话{v}"]).format(v=mobile(rng)))
        elif k == "email":
            template = rng.choice(["检查报告请发到{v}谢谢", "邮箱{v}", "结果发我邮箱{v}，麻烦了"])
            parts.append(template.format(v=email(rng)))
        else:
            parts.append(rng.choice(["挂号费从银行卡{v}扣", "我的卡号{v}", "退款请打到{v}"]).format(v=bank_card(rng)))
    return "，".join(parts) + "。"


# --------------------------------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------------------------------


def _numbers(rng: random.Random) -> dict:
    return {
        "n": rng.randint(1, 12), "sbp": rng.randint(100, 190), "dbp": rng.randint(60, 115),
        "glu": f"{rng.uniform(4.0, 16.0):.1f}", "temp": f"{rng.uniform(36.2, 40.2):.1f}", "hr": rng.randint(52, 130),
        "hb": rng.randint(70, 160), "ua": rng.randint(200, 650), "wbc": f"{rng.uniform(3.0, 18.0):.1f}",
        "a1c": f"{rng.uniform(5.0, 11.5):.1f}", "days": rng.choice([3, 5, 7, 10, 14]),
        "weeks": rng.choice([1, 2, 4, 8]),
        "year": rng.randint(2018, 2025), "month": rng.randint(1, 12), "day": rng.randint(1, 28),
        "approval": f"20{rng.randint(0, 999999):06d}", "batch": f"{rng.randint(20180101, 20251231)}",
    }


def human_message(rng: random.Random, cond: tuple, other: tuple, nums: dict) -> str:
    name, _dept, symptoms, _exams, drugs, _advice = cond
    who, sex, ages = rng.choice(PATIENTS)
    sex = sex or rng.choice("男女")
    age = rng.randint(*ages)
    syms = rng.sample(symptoms, rng.randint(1, min(4, len(symptoms))))
    if rng.random() < 0.3:
        syms.append(rng.choice(other[2]))
    sentences = [
        f"{who}{age}岁，{sex}。" if rng.random() < 0.7 else f"{who}今年{age}了。",
        rng.choice(ONSETS) + "、".join(syms) + rng.choice(DURATIONS).format(n=nums["n"])
        + rng.choice(["了", "", "左右"]) + "。",
    ]
    if rng.random() < 0.5:
        sentences.append(rng.choice(HISTORY).format(cond=other[0], n=nums["n"]) + "。")
    if rng.random() < 0.6:
        findings = rng.sample(FINDINGS, rng.randint(1, 2))
        sentences.append("测了一下" + "，".join(f.format(**nums) for f in findings) + "。")
    if rng.random() < 0.35:
        drug, dose, _freq = rng.choice(drugs + other[4])
        sentences.append(f"自己吃了{drug}，一次{dose}，{rng.choice(['没什么效果', '好一点了', '吃完胃不舒服'])}。")
    body = sentences[:1] + rng.sample(sentences[1:], len(sentences) - 1) if rng.random() < 0.5 else sentences
    q = " ".join(rng.sample(QUESTIONS, rng.randint(1, 2))).format(cond=name if rng.random() < 0.5 else other[0])
    return rng.choice(OPENERS) + "".join(body) + q


def gpt_message(rng: random.Random, cond: tuple, nums: dict) -> str:
    name, dept, symptoms, exams, drugs, advice = cond
    exam, exam2 = rng.sample(exams, 2) if len(exams) > 1 else (exams[0], exams[0])
    drug, dose, freq = rng.choice(drugs)
    parts = [
        rng.choice(DIAGNOSES).format(cond=name),
        rng.choice(EXAM_ADVICE).format(dept=dept, exam=exam, exam2=exam2),
        rng.choice(DRUG_ADVICE).format(drug=drug, dose=dose, freq=freq, days=nums["days"]),
    ]
    parts += rng.sample(advice, rng.randint(1, len(advice)))
    if rng.random() < 0.6:
        parts.append(rng.choice(WARNINGS).format(sym2=rng.choice(symptoms), days=nums["days"]))
    if rng.random() < 0.15:
        parts.append(rng.choice(DRUG_FACTS).format(**nums))
    middle = parts[2:]
    rng.shuffle(middle)
    return rng.choice(ANSWER_OPENERS) + "，".join(parts[:2]) + "。" + "。".join(middle) + "。"


def normal_record(rng: random.Random) -> list[list[str]]:
    """[[from, value], ...]: one or two rounds of a patient-doctor exchange."""
    cond, other = rng.sample(CONDITIONS, 2)
    nums = _numbers(rng)
    turns = [["human", human_message(rng, cond, other, nums)], ["gpt", gpt_message(rng, cond, nums)]]
    if rng.random() < 0.2:
        drug = rng.choice(cond[4])[0]
        turns.append(["human", rng.choice(FOLLOWUPS).format(drug=drug)])
        turns.append(["gpt", rng.choice(FOLLOWUP_ANSWERS).format(**nums) + "。"])
    return turns


def mutate(rng: random.Random, turns: list[list[str]]) -> list[list[str]]:
    """A near duplicate: 1-3 characters replaced, deleted or inserted in the longest message."""
    out = [list(t) for t in turns]
    target = max(range(len(out)), key=lambda i: len(out[i][1]))
    text = out[target][1]
    for _ in range(rng.randint(1, 3)):
        pos = rng.randrange(len(text))
        op = rng.random()
        if op < 0.5:
            text = text[:pos] + rng.choice(MUTATION_CHARS) + text[pos + 1:]
        elif op < 0.75 and len(text) > 1:
            text = text[:pos] + text[pos + 1:]
        else:
            text = text[:pos] + rng.choice(MUTATION_CHARS) + text[pos:]
    if text == out[target][1]:
        text += rng.choice(MUTATION_CHARS)
    out[target][1] = text
    return out


def to_line(turns: list[list[str]]) -> str:
    return json.dumps({"conversations": [{"from": f, "value": v} for f, v in turns]}, ensure_ascii=False)


def malformed_line(rng: random.Random, turns: list[list[str]]) -> str:
    line = to_line(turns)
    kind = rng.randrange(4)
    if kind == 0:  # truncated mid-record
        return line[: rng.randint(1, len(line) - 2)]
    if kind == 1:  # Python repr, single quotes
        return repr({"conversations": [{"from": f, "value": v} for f, v in turns]})
    if kind == 2:  # trailing comma
        return line[:-1] + ",}"
    return turns[0][1]  # bare text, no JSON at all


def _category(rng: random.Random) -> str:
    u, acc = rng.random(), 0.0
    for name, rate in RATES.items():
        acc += rate
        if u < acc:
            return name
    return "normal"


def write_corpus(out: TextIO, records: int, seed: int = 0, progress: TextIO | None = None) -> dict:
    """Write `records` lines to `out`; return {"records", "seed", "counts": {category: n}}."""
    rng = random.Random(seed)
    recent: deque[list[list[str]]] = deque(maxlen=RECENT)
    counts: Counter[str] = Counter()
    t0 = time.perf_counter()
    for i in range(records):
        cat = _category(rng)
        if cat in ("exact_dup", "near_dup") and not recent:
            cat = "normal"
        if cat == "exact_dup":
            turns = recent[rng.randrange(len(recent))]
        elif cat == "near_dup":
            turns = mutate(rng, recent[rng.randrange(len(recent))])
        else:
            turns = normal_record(rng)
            if cat == "pii":
                pii = pii_sentence(rng)
                turns[0][1] = (pii + turns[0][1]) if rng.random() < 0.5 else (turns[0][1] + pii)
            elif cat == "low_info":
                turns = [turns[0], ["gpt", rng.choice(LOW_INFO)]]
            elif cat == "signoff":
                turns[-1][1] += rng.choice(["", "\n", " "]) + rng.choice(SIGNOFFS)
        if cat == "malformed":
            out.write(malformed_line(rng, turns) + "\n")
        else:
            out.write(to_line(turns) + "\n")
            if cat != "exact_dup":
                recent.append(turns)
        counts[cat] += 1
        if progress is not None and (i + 1) % PROGRESS_EVERY == 0:
            dt = time.perf_counter() - t0
            print(f"make_dirty_corpus: {i + 1:,}/{records:,} records, {(i + 1) / dt:,.0f} records/s", file=progress)
    return {"records": records, "seed": seed, "counts": {c: counts.get(c, 0) for c in CATEGORIES}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--records", type=int, required=True, help="number of lines to write")
    ap.add_argument("--out", type=Path, required=True, help="output JSONL file")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.records < 0:
        ap.error("--records must be >= 0")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(args.out, "w", encoding="utf-8", newline="\n", buffering=1 << 20) as f:
        summary = write_corpus(f, args.records, args.seed, progress=sys.stderr)
    summary["out"] = str(args.out)
    summary["bytes"] = args.out.stat().st_size
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(summary, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
