"""PII redaction: every type's true positives replaced and counted; clinical and public numbers survive."""

from __future__ import annotations

import datetime as dt

import pytest

from medgpt_ray.data.ops.pii import (
    PLACEHOLDERS,
    id_checksum_ok,
    luhn_ok,
    redact,
    valid_resident_id,
)

ALL = tuple(PLACEHOLDERS)
ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)


def id_check(first17: str) -> str:
    return "10X98765432"[sum(int(c) * w for c, w in zip(first17, ID_WEIGHTS, strict=True)) % 11]


def make_id(first17: str) -> str:
    return first17 + id_check(first17)


def luhn_complete(prefix: str) -> str:
    """prefix + the check digit that makes it pass Luhn."""
    for d in "0123456789":
        if luhn_ok(prefix + d):
            return prefix + d
    raise AssertionError


def id_with_x() -> str:
    for seq in range(1000):
        first17 = f"11010519650321{seq:03d}"
        if id_check(first17) == "X":
            return make_id(first17)
    raise AssertionError


def only(kind: str, n: int = 1) -> dict[str, int]:
    counts = dict.fromkeys(ALL, 0)
    counts[kind] = n
    return counts


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


def test_validators():
    assert valid_resident_id("110105196709131164")  # from the sample README (synthetic)
    assert valid_resident_id("11010519650321436X") and valid_resident_id("11010519650321436x")
    assert not id_checksum_ok("310104198201088743")
    assert luhn_ok("4367428900435648930") and not luhn_ok("2023694204583178")


# --------------------------------------------------------------------------------------------------
# true positives
# --------------------------------------------------------------------------------------------------

ID_A = "110105196709131164"
ID_X = id_with_x()


@pytest.mark.parametrize("text, expected", [
    (f"身份证号{ID_A}，请核对", "身份证号<ID_CARD>，请核对"),
    (f"证件{ID_X}。", "证件<ID_CARD>。"),
    (f"证件{ID_X.lower()}。", "证件<ID_CARD>。"),
    (f"ID:{ID_A}", "ID:<ID_CARD>"),
    (f"号码 {ID_A[:6]} {ID_A[6:14]} {ID_A[14:]} 已登记", "号码 <ID_CARD> 已登记"),
    ("老身份证号：110105670913116", "老身份证号：<ID_CARD>"),
    ("身份证号码是 330106891012123 ", "身份证号码是 <ID_CARD> "),
])
def test_id_cards(text, expected):
    out, counts = redact(text, ALL)
    assert out == expected
    assert counts == only("id_card")


def test_id_card_x_variants_are_real_x_checksums():
    assert ID_X.endswith("X") and valid_resident_id(ID_X)


CARD16 = luhn_complete("622202023128861")
CARD19 = "4367428900435648930"


@pytest.mark.parametrize("text", [
    f"卡号{CARD16}",
    f"卡号 {CARD16[:4]} {CARD16[4:8]} {CARD16[8:12]} {CARD16[12:]}",
    f"卡号{CARD16[:4]}-{CARD16[4:8]}-{CARD16[8:12]}-{CARD16[12:]}",
    f"卡号{CARD19}",
    "卡号4367 4289 0043 5648 930",
    "卡号62284858868352350",
])
def test_bank_cards(text):
    out, counts = redact(text, ALL)
    assert out.replace(" ", "") == "卡号<BANK_CARD>"
    assert counts == only("bank_card")


@pytest.mark.parametrize("text", [
    "13912345678", "139 1234 5678", "139-1234-5678", "+86 139 1234 5678", "+86-135-6488-6328",
    "+8613912345678", "+86 17740865359", "0086 139 1234 5678", "8613912345678", "(+86)13912345678",
    "010-62345678", "0755-69746078", "025 61184437", "(021) 56891625", "（021）56891625",
    "021-56891625-8021", "021-56891625转123", "0755-6974 6078", "+86 21 56891625",
])
def test_phones(text):
    out, counts = redact(f"电话{text}，谢谢", ALL)
    assert out == "电话<PHONE>，谢谢"
    assert counts == only("phone")


@pytest.mark.parametrize("text, expected", [
    ("邮箱li.na39@foxmail.com联系我", "邮箱<EMAIL>联系我"),
    ("发到yang_min1971@qq.com。", "发到<EMAIL>。"),
    ("请发至-zhang.wei+med@mail.hospital.org.cn谢谢", "请发至-<EMAIL>谢谢"),
    ("邮箱：chen＠126.com", "邮箱：<EMAIL>"),
    ("QQ邮箱13912345678@qq.com", "QQ邮箱<EMAIL>"),  # one e-mail, not a phone
])
def test_emails(text, expected):
    out, counts = redact(text, ALL)
    assert out == expected
    assert counts == only("email")


def test_mixed_counts_and_order():
    text = (f"患者身份证{ID_A}，手机139 2727 1554，座机025-61184437，"
            f"邮箱li.na39@foxmail.com，卡号{CARD19}，另一张{CARD16}。")
    out, counts = redact(text, ALL)
    assert counts == {"email": 1, "id_card": 1, "bank_card": 2, "phone": 2}
    assert out == ("患者身份证<ID_CARD>，手机<PHONE>，座机<PHONE>，"
                   "邮箱<EMAIL>，卡号<BANK_CARD>，另一张<BANK_CARD>。")
    for value in (ID_A, "2727", "61184437", "foxmail", CARD19, CARD16):
        assert value not in out


def test_types_subset():
    text = f"邮箱a@b.com 手机13912345678 身份证{ID_A}"
    out, counts = redact(text, ["email"])
    assert out == f"邮箱<EMAIL> 手机13912345678 身份证{ID_A}"
    assert counts == {"email": 1}
    with pytest.raises(ValueError, match="unknown PII type"):
        redact(text, ["passport"])


# --------------------------------------------------------------------------------------------------
# look-alikes that must survive verbatim
# --------------------------------------------------------------------------------------------------

BAD_CHECK_ID = "310104198201088743"
BAD_LUHN = "2023694204583178"


def id_shaped_bad_checksum_passing_luhn() -> str:
    for seq in range(1000):
        first17 = f"32010619670905{seq:03d}"
        candidate = luhn_complete(first17)
        if not id_checksum_ok(candidate):
            return candidate
    raise AssertionError


def future_birth_id() -> str:
    year = dt.date.today().year + 1
    for seq in range(1000):
        value = make_id(f"110105{year}0101{seq:03d}")
        if value[-1].isdigit() and not luhn_ok(value):  # so that it is not a valid bank card number either
            return value
    raise AssertionError


LOOKALIKES = [
    "每次500mg，每日3次", "阿莫西林0.25g", "剂量0.5g tid×7d", "WBC 12.5×10^9/L", "肌酐520μmol/L",
    "FT4 38.6pmol/L", "血红蛋白98g/L", "血压140/90mmHg", "血压160/100mmHg", "2023-05-12", "2023/11/20",
    "2023年5月12日", "2024年3月8日", "国药准字H20051234", "国药准字Z11020001", "批号20230512", "批号B2305121",
    "条码6901234567892", "门诊号20230512001", "急救电话120", "匪警110", "火警119", "交通事故122",
    "卫生热线12320", "市民热线12345", "消费者投诉12315", "银行客服95588", "客服400-820-8820",
    "客服4008208820", "时间2023-05-12 14:30", "体温38.5℃", "心率110次/分", "BMI 24.5kg/m2",
    BAD_CHECK_ID, BAD_LUHN, "2023985379146130",
    "身份证号99010519670913116X",  # no such province
    "99010519670913116",  # 17 digits
    "110105670913116",  # a 15-digit number without an ID keyword nearby
    future_birth_id(),  # valid check digit, but born next year
    "11010518990101123X",  # born before 1900
    "11010519670230123X",  # 30 February
    "1234567890123456789012",  # a long digit run: no card or phone inside it
    "手机号1391234567",  # 10 digits
    "编号123913912345678",  # a mobile-shaped tail of a longer run
]


@pytest.mark.parametrize("text", LOOKALIKES)
def test_lookalikes_survive(text):
    out, counts = redact(text, ALL)
    assert out == text
    assert sum(counts.values()) == 0


def test_id_shaped_luhn_valid_number_is_not_a_card():
    value = id_shaped_bad_checksum_passing_luhn()
    assert luhn_ok(value) and not valid_resident_id(value)
    assert redact(f"号码{value}", ALL) == (f"号码{value}", dict.fromkeys(ALL, 0))


def test_card_inside_longer_run_survives():
    assert luhn_ok(CARD16)
    run = "9" + CARD16 + "9999"  # 21 digits, a Luhn-valid card in the middle
    assert redact(run, ALL) == (run, dict.fromkeys(ALL, 0))
    grouped_run = f"{CARD16[:4]} {CARD16[4:8]} {CARD16[8:12]} {CARD16[12:]}12"
    assert redact(grouped_run, ["bank_card"]) == (grouped_run, {"bank_card": 0})


def test_card_followed_by_a_short_number():
    out, counts = redact(f"卡号{CARD16[:4]} {CARD16[4:8]} {CARD16[8:12]} {CARD16[12:]} 2张", ALL)
    assert out == "卡号<BANK_CARD> 2张" and counts == only("bank_card")


def test_lookalikes_next_to_pii():
    text = "2023-05-12就诊，血压140/90mmHg，国药准字H20051234，电话13912345678，拨打120"
    out, counts = redact(text, ALL)
    assert out == "2023-05-12就诊，血压140/90mmHg，国药准字H20051234，电话<PHONE>，拨打120"
    assert counts == only("phone")
