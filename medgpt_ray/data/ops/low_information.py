"""Low-information responses: what the quality checks drop from an assistant or chosen answer that says nothing
(data/ops/quality.py runs these checks first on a response, then its length and character checks).

Brevity is not low information: medical QA (knowledge-graph questions above all) is full of correct one-term
answers -- 阿奇霉素, 肿瘤科；肿瘤外科, 颈内静脉, 0.05%, TP53基因突变, 46条, CT, 肝 -- and the entropy of a one- or
two-token answer is 0 or 1 bit whatever it says. So a response is judged by what it contains, and entropy only
once it is long enough to mean something:

    too_short         nothing but whitespace/punctuation (empty, "。。。", "**", a reply that was only a sign-off)
    non_answer        no content token once markup is removed: HTML tags/entities (<br>, &nbsp;), chat
                      placeholders ([图片], [表情], [语音] …), emoji and other symbols
    low_entropy / non_answer
                      filler: every punctuation/whitespace-separated chunk is made up entirely of FILLER_PHRASES
                      (acknowledgements 好的/谢谢/嗯嗯/收到/知道了/OK, greetings, forum noise 顶/赞, and non-answers
                      不知道/不清楚/同上/无/略/因人而异) and DEFLECTIONS (content-free "请咨询医生", "请到医院就诊",
                      "请详细描述您的问题", "请稍等", "还有其他问题吗", "无法回答" …). Reported as low_entropy when the
                      Shannon entropy of its jieba tokens is below min_response_entropy_bits (嗯, 好的好的),
                      else non_answer (好的，知道了). Only texts of up to FILLER_MAX_CHARS content characters are
                      tried (filler is short; this bounds the cost).
    low_entropy       a unit repeated: the text without punctuation/whitespace is one character 3+ times
                      (啊啊啊啊, 666666) or one non-numeric string of 2+ characters 2+ times (阿莫西林阿莫西林);
                      "1:1", "10:10" stay (repeated digits are real answers)
    low_entropy       responses of at least min_entropy_tokens jieba content tokens (tokens with a letter or
                      digit) whose token entropy, in bits, is below min_response_entropy_bits

The evaluation sets tests/data/short_medical_qa.jsonl (short factual answers, must be kept) and
tests/data/filler_answers.jsonl (filler, must be dropped) pin this behaviour.
"""

from __future__ import annotations

import re

from medgpt_ray.config import QualityConfig
from medgpt_ray.data.ops.text_measures import content_tokens, is_content_char, is_separator, token_entropy

FILLER_MAX_CHARS = 64

# Filler phrases, compared with the lower-cased text of a chunk (a chunk is a run of text between punctuation or
# whitespace): a chunk that is a concatenation of these (and DEFLECTIONS) carries no answer. Deliberately left
# out because they are real short answers to yes/no questions: 不会, 不是, 没有, 有, 不可以, and bare numbers.
# A bare 是/对/可以 is read as an acknowledgement; with a term (是，属于遗传病) the term makes it an answer.
FILLER_PHRASES = frozenset(
    # acknowledgements, agreement, thanks, greetings, interjections and the particles/pronouns around them
    "好 好的 好滴 好哒 好嘞 好吧 好呀 好啊 好了 行 行吧 行的 可以 可以的 ok okay okk 嗯 恩 嗯呢 嗯哼 哦 噢 喔 "
    "啊 呃 额 唔 哈 呵 嘿 嘻 哇 诶 欸 收到 知道 知道了 知道啦 晓得 晓得了 明白 明白了 了解 了解了 懂了 清楚了 "
    "是 是的 对 对的 没错 没问题 谢 谢谢 谢啦 谢了 多谢 感谢 感恩 非常 太 十分 万分 真是 辛苦 辛苦了 麻烦 "
    "麻烦了 不客气 不用谢 没关系 你好 您好 哈喽 hello hi 在吗 在的 在 我 你 您 我们 的 了 啦 呢 吧 呀 也 "
    "都 亲 医生 大夫 老师 thanks thank you thx 唉 哎 哎呀 哎哟 呜 已收到 您的 你的 解答 回答 回复 "
    "会注意的 我会注意 会注意 这个 这样 这样啊 原来 原来如此 原来是这样 耐心 "
    # non-answers and forum noise
    "不知道 不清楚 不太清楚 不了解 不太了解 不太懂 不确定 不好说 说不好 不晓得 不懂 同上 如上 见上 同楼上 楼上 "
    "无 暂无 略 没了 没有了 就这些 待定 看情况 因人而异 难说 无可奉告 抱歉 对不起 不好意思 顶 赞 沙发 路过 mark"
    .split()
)
_FILLER_LENGTHS = tuple(sorted({len(p) for p in FILLER_PHRASES}, reverse=True))

_YOU = r"(?:您|你)?"
_PLEASE = r"(?:请问|请|建议|最好|麻烦|我会|我)?" + _YOU + r"(?:尽快|及时|再)?"
# Content-free deflections, matched inside a lower-cased chunk (no punctuation or whitespace left in it).
DEFLECTIONS = tuple(re.compile(p) for p in (
    # 请咨询医生, 建议咨询专业医生, 问问你的主治大夫
    _PLEASE + r"(?:去|到)?(?:咨询|问问|问一下|问|请教)(?:一下)?" + _YOU + r"(?:的)?"
    r"(?:专业|专科|主治|当地|相关|线下)?(?:的)?(?:医生|医师|大夫|专家)",
    # 请到医院就诊, 建议去正规医院看看, 建议就医
    _PLEASE + r"(?:去|到|前往)(?:正规)?医院(?:就诊|就医|检查|看看|看一下|看下|复查)?",
    _PLEASE + r"(?:就医|就诊)",
    # 请详细描述您的问题, 请补充您的病情描述, 请提供更多信息
    _PLEASE + r"(?:详细|具体|仔细)?(?:地)?(?:描述|说明|说说|说|讲讲|讲|补充|提供|介绍)(?:一下)?" + _YOU
    + r"(?:的)?(?:更多|更详细|详细)?(?:的)?(?:问题|症状|病情描述|病情|情况|病史|信息|资料|描述)*",
    # 请问还有什么问题吗, 还有其他问题吗, 请问您有什么问题, 请问有什么可以帮您
    _PLEASE + r"(?:还)?有(?:其他|别的)?(?:什么)?(?:问题|疑问|需要)(?:吗)?",
    _PLEASE + r"(?:有)?什么(?:可以|能)?(?:帮|帮助)(?:到)?(?:您|你)(?:的)?(?:吗)?",
    # 请稍等, 正在为您查询
    _PLEASE + r"稍等(?:一下|片刻)?",
    r"正在(?:为您|帮您|为你|帮你)?(?:查询|处理|核实)(?:中)?",
    # 请上传检查报告
    _PLEASE + r"(?:上传|发|发送)(?:一下)?(?:检查|化验)?(?:报告|单|图片|照片)",
    # 我无法回答这个问题, 这个问题无法回答
    r"(?:我)?(?:这个问题|此问题)?(?:我)?(?:无法|不能|没法|不便)(?:回答|回复|解答)(?:这个问题|您的问题|此问题)?",
))

# Markup that is not content: HTML tags (a letter right after "<", so "<5.2mmol/L" is not a tag), entities, and
# chat-export placeholders.
_MARKUP = re.compile(
    r"</?[a-zA-Z][a-zA-Z0-9]*(?:\s[^<>]*)?/?>|&(?:[a-zA-Z]+|#[0-9]+|#x[0-9a-fA-F]+);"
    r"|\[(?:图片|图|表情|动画表情|语音|视频|链接|文件|image|img|emoji|sticker)\]",
    re.IGNORECASE,
)
_REPEATED_UNIT = re.compile(r"(.+?)\1+", re.DOTALL)


def _chunks(text: str) -> list[str]:
    """Lower-cased runs of `text` between separators (whitespace, punctuation)."""
    out, cur = [], []
    for ch in text:
        if is_separator(ch):
            if cur:
                out.append("".join(cur))
                cur = []
        else:
            cur.append(ch.lower())
    if cur:
        out.append("".join(cur))
    return out


def _filler_chunk(chunk: str) -> bool:
    """True if `chunk` is a concatenation of FILLER_PHRASES and DEFLECTIONS (dynamic programming over positions)."""
    n = len(chunk)
    reach = [False] * (n + 1)
    reach[0] = True
    for i in range(n):
        if not reach[i]:
            continue
        for length in _FILLER_LENGTHS:
            if i + length <= n and chunk[i : i + length] in FILLER_PHRASES:
                reach[i + length] = True
        for rx in DEFLECTIONS:
            m = rx.match(chunk, i)
            if m is not None and m.end() > i:
                reach[m.end()] = True
    return reach[n]


def is_filler(text: str) -> bool:
    """True if every chunk of `text` (markup removed) is filler (see the module docstring); False for no chunk."""
    if len(text) > 4 * FILLER_MAX_CHARS:
        return False
    chunks = _chunks(_MARKUP.sub(" ", text))
    if not chunks or sum(map(len, chunks)) > FILLER_MAX_CHARS:
        return False
    return all(_filler_chunk(c) for c in chunks)


def repeated_unit(text: str) -> bool:
    """True if `text` without separators is one character 3+ times or one non-numeric string 2+ times."""
    if len(text) > 4 * FILLER_MAX_CHARS:
        return False
    squashed = "".join(_chunks(text))
    if len(squashed) > FILLER_MAX_CHARS:
        return False  # long texts: the character 3-gram check (repetitive) judges them
    m = _REPEATED_UNIT.fullmatch(squashed)
    if m is None:
        return False
    unit = m.group(1)
    if len(unit) == 1:
        return len(squashed) >= 3
    return not any(c.isdigit() for c in unit)


def response_reason(text: str, cfg: QualityConfig) -> str | None:
    """The low-information checks of a response (see the module docstring): the reason, or None."""
    if not any(not is_separator(ch) for ch in text):
        return "too_short"  # empty, or punctuation only (e.g. a reply that was nothing but a sign-off)
    stripped = _MARKUP.sub(" ", text)
    if not any(is_content_char(ch) for ch in stripped):
        return "non_answer"  # markup, emoji or symbols only
    if is_filler(stripped):
        return "low_entropy" if token_entropy(content_tokens(stripped)) < cfg.min_response_entropy_bits \
            else "non_answer"
    if repeated_unit(stripped):
        return "low_entropy"
    # A text of fewer characters than min_entropy_tokens cannot have that many tokens: no jieba call for it.
    if len(stripped) >= cfg.min_entropy_tokens:
        tokens = content_tokens(stripped)
        if len(tokens) >= cfg.min_entropy_tokens and token_entropy(tokens) < cfg.min_response_entropy_bits:
            return "low_entropy"
    return None
