"""PII redaction for Chinese medical text: resident IDs, phones, e-mails and bank cards -> typed placeholders.

Plain Python `re` (not pyarrow's RE2): the rules need look-arounds and a validation callback per candidate.

Each type is a candidate regex plus a validator, so that clinical and public numbers survive:

    id_card    18 characters (17 digits + digit/X/x), optionally grouped 6-8-4 by one space or dash, with
               a real province prefix, a real birth date (1900..today) and the GB 11643 check digit;
               15-digit legacy numbers only within 10 characters after 身份证/证件号/身份号码.
    bank_card  16-19 digits, plain or grouped 4-4-4-4(-1..3) by spaces/dashes, passing Luhn, not part of a
               longer digit run, and not an 18-digit string shaped like a resident ID (province + birth date).
    phone      mainland mobiles 1[3-9]x-xxxx-xxxx with optional +86/0086/86 and space/dash grouping;
               landlines with an area code written 0xx-/0xxx- (or (0xx) / +86 xx) and a 7-8 digit number
               starting 2-9, optional extension. Public service numbers (110, 120, 12320, 12345, 95xxx,
               400-xxx-xxxx business lines) have no such shape and are never touched.
    email      ASCII local part @ domain; works when glued to Chinese characters (no \\b, which treats CJK
               characters as word characters).

Numbers are never matched inside longer digit runs, so doses (500mg), lab values, blood pressure
(140/90mmHg), dates (2023-05-12, 2023年5月12日), approval numbers (国药准字H20051234), batch numbers and
EAN-13 barcodes stay. Order: e-mail (the only type with an unambiguous anchor, so that 13912345678@qq.com
is one e-mail, not a phone) -> ID cards -> bank cards -> phones.

Nothing here logs or prints text.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Collection

PLACEHOLDERS = {"id_card": "<ID_CARD>", "phone": "<PHONE>", "email": "<EMAIL>", "bank_card": "<BANK_CARD>"}
ORDER = ("email", "id_card", "bank_card", "phone")

# First two digits of a resident ID (GB/T 2260 provinces, 71 Taiwan, 81 Hong Kong, 82 Macao).
PROVINCES = frozenset([*range(11, 16), *range(21, 24), *range(31, 38), *range(41, 47), *range(50, 55),
                       *range(61, 66), 71, 81, 82])
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"

_ID18 = re.compile(r"(?<![0-9])([1-9][0-9]{5})[ -]?([0-9]{8})[ -]?([0-9]{3}[0-9Xx])(?![0-9])")
_ID15 = re.compile(r"(身份证(?:号码|号)?|证件号(?:码)?|身份号码)([^0-9\n]{0,10})(?<![0-9])([1-9][0-9]{14})(?![0-9])")
_BANK = re.compile(r"(?<![0-9])(?:[0-9]{4}(?:[ -][0-9]{4}){3}(?:[ -][0-9]{1,3})?|[0-9]{16,19})(?![0-9])")
_MOBILE = re.compile(
    r"(?<![0-9+])(?:\(?(?:\+|00)?86\)?[ -]?)?1[3-9][0-9](?:[ -]?[0-9]{4}){2}(?![0-9])"
)
_LANDLINE = re.compile(
    r"(?<![0-9+])"
    r"(?:(?:\+|00)86[ -]?(?:\(0?[1-9][0-9]{1,2}\)|0?[1-9][0-9]{1,2})[ -]?"  # +86 21 / +86 (0)21
    r"|\(0[1-9][0-9]{1,2}\) ?|（0[1-9][0-9]{1,2}） ?"  # (021) / （021）
    r"|0[1-9][0-9]{1,2}[ -])"  # 021- / 0755 + space
    r"(?:[2-9][0-9]{6,7}|[2-9][0-9]{2,3}[ -][0-9]{4})"
    r"(?:(?:-|转|分机|ext\.? ?)[0-9]{1,6})?"
    r"(?![0-9])"
)
_EMAIL = re.compile(
    r"[A-Za-z0-9_][A-Za-z0-9._%+\-]{0,63}[@＠]"
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}"
)
_HAS_DIGIT = re.compile(r"[0-9]")


def _birth_date_ok(year: int, month: int, day: int) -> bool:
    if year < 1900:
        return False
    try:
        return _dt.date(year, month, day) <= _dt.date.today()
    except ValueError:
        return False


def id_shaped(digits: str) -> bool:
    """Province prefix and birth date of an 18-character resident ID are real (the check digit is not tested)."""
    return (int(digits[:2]) in PROVINCES
            and _birth_date_ok(int(digits[6:10]), int(digits[10:12]), int(digits[12:14])))


def id_checksum_ok(id18: str) -> bool:
    total = sum(int(c) * w for c, w in zip(id18[:17], _ID_WEIGHTS, strict=True))
    return _ID_CHECK[total % 11] == id18[17].upper()


def valid_resident_id(id18: str) -> bool:
    """GB 11643: 17 digits + check character, real province, real birth date, check digit right."""
    return (len(id18) == 18 and id18[:17].isdigit() and id_shaped(id18) and id_checksum_ok(id18))


def valid_legacy_id(id15: str) -> bool:
    """15-digit (pre-1999) ID: province and a 19yy birth date are real; there is no check digit."""
    return (len(id15) == 15 and id15.isdigit() and int(id15[:2]) in PROVINCES
            and _birth_date_ok(1900 + int(id15[6:8]), int(id15[8:10]), int(id15[10:12])))


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _sub_id_card(text: str) -> tuple[str, int]:
    n = 0

    def repl18(m: re.Match) -> str:
        nonlocal n
        if valid_resident_id(m.group(1) + m.group(2) + m.group(3)):
            n += 1
            return PLACEHOLDERS["id_card"]
        return m.group(0)

    def repl15(m: re.Match) -> str:
        nonlocal n
        if valid_legacy_id(m.group(3)):
            n += 1
            return m.group(1) + m.group(2) + PLACEHOLDERS["id_card"]
        return m.group(0)

    text = _ID18.sub(repl18, text)
    text = _ID15.sub(repl15, text)
    return text, n


def _sub_bank_card(text: str) -> tuple[str, int]:
    n = 0

    def is_card(candidate: str) -> bool:
        digits = candidate.replace(" ", "").replace("-", "")
        if not 16 <= len(digits) <= 19 or not luhn_ok(digits):
            return False
        return not (len(digits) == 18 and id_shaped(digits))  # an ID with a wrong check digit is not a card

    def repl(m: re.Match) -> str:
        nonlocal n
        value = m.group(0)
        if is_card(value):
            n += 1
            return PLACEHOLDERS["bank_card"]
        if len(value) > 19:  # grouped 4-4-4-4 plus a short group: the card may be the first 16 ("… 8619 2张")
            if is_card(value[:19]):
                n += 1
                return PLACEHOLDERS["bank_card"] + value[19:]
        return value

    return _BANK.sub(repl, text), n


def _sub_phone(text: str) -> tuple[str, int]:
    text, a = _MOBILE.subn(PLACEHOLDERS["phone"], text)
    text, b = _LANDLINE.subn(PLACEHOLDERS["phone"], text)
    return text, a + b


def _sub_email(text: str) -> tuple[str, int]:
    if "@" not in text and "＠" not in text:
        return text, 0
    return _EMAIL.subn(PLACEHOLDERS["email"], text)


_SUBSTITUTERS = {"email": _sub_email, "id_card": _sub_id_card, "bank_card": _sub_bank_card, "phone": _sub_phone}


def redact(text: str, types: Collection[str]) -> tuple[str, dict[str, int]]:
    """Replace every PII item of `types` by its placeholder; returns (text, {type: count}) with a count for every
    requested type (0 included)."""
    unknown = set(types) - set(PLACEHOLDERS)
    if unknown:
        raise ValueError(f"unknown PII type(s) {sorted(unknown)} (expected some of {sorted(PLACEHOLDERS)})")
    counts = {t: 0 for t in ORDER if t in types}
    has_digit = _HAS_DIGIT.search(text) is not None
    for t in counts:
        if t != "email" and not has_digit:
            continue
        text, counts[t] = _SUBSTITUTERS[t](text)
    return text, counts
