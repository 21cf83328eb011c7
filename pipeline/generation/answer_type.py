"""What kind of answer a question asks for, and whether a sentence offers one it did not already have.

「谁在第 50 届超级碗上演唱了国歌？」 wants a person: a sentence that only restates the question (「…超级碗…国歌」)
does not answer it, one naming a person the question does not name (「女神卡卡献唱了国歌」) may. Cheap cues:
question words for the kind, jieba's part-of-speech tags (nr person, ns place) and number / date patterns for
the offer. The picker weighs the cue (w_type, fitted leave-one-set-out; pipeline/generation/extractive.py).

Formal documents (laws, regulations, contracts; issue 25) are asked in everyday words for a verdict, and answered
by the clause that decides it: 「钱撕破了去银行换要收手续费吗？」 (yes/no) by 「无偿为公众兑换…」, 「不交会怎么样？」
(consequence) by 「责令限期改正…罚款」, 「找哪个部门批？」 (body) by 「由…药品监督管理部门审批」. Those kinds' offers are the
deciding words themselves (DECIDING): modal verdicts, penalties, bodies. They were not fitted: the words are the
ones Chinese legal drafting uses for each, and the weight is the same w_type.
A penalty clause answers only a question about what happens to someone: asked anything else, a sentence imposing a
sanction nobody asked about counts against it by the same weight (`kind_cue`: the picker's cue is offers − that).

A figure is checked, not judged: a number question that names what it counts (「几块钱」「多少天」「多久」) is offered
only a number in those units, never an article number (「第二十二条」) or a date for a length of time, nor — when it
asks no sanction — the amount of a fine (「处…1倍以上2倍以下的罚款」 for 「这个费用每亩收多少？」); and when none of an
answer's sentences offers the number or date asked (`lacks_answer`), the answer says so and is weak.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable

from pipeline.generation.sentences import clauses

# 「…会怎么处理」「被怎么处理」 ask what is done to someone; 「这些资产怎么处理」「划痕怎么处理」 ask how to deal with a thing.
# Order matters: 「哪一年」 is a time before 「哪」 makes it anything, 「多少年」 a time before 「多少」 a number; 「会不会被
# 罚款」 a consequence before 「会不会」 a yes/no; 「找哪个部门」 a body before 「哪个」 a place; yes/no last (「能免费查几次吗」
# wants the number). 「谁发」 alone is no body: 「由谁发明 / 发动 / 发掘」 ask for a person.
_KINDS: list[tuple[str, re.Pattern]] = [
    ("consequence", re.compile(r"会怎么?样|会如何|(?:会|被|将)(?:怎么|如何)处理|怎么处罚|如何处罚|怎么罚|罚多少|什么后果|什么责任|"
                               r"被罚|受罚|会不会罚|处罚吗|被处罚|担什么责")),
    ("body", re.compile(r"哪个?(?:部门|机关|单位|机构)|哪一?级(?:政府|部门)?|找谁|向谁|归谁|谁(?:来)?(?:批|管|审批|核定|鉴定|负责|发放|发证|发给|办)")),
    ("time", re.compile(r"何时|什么时候|哪一?年|哪一?天|什么时间|何年|多少年前|哪个?世纪|哪个?朝代|哪个?年代|哪个?时期|几月|几号|何日|几几年")),
    ("person", re.compile(r"谁|哪一?位|何人|什么人|哪个人|哪些人")),
    ("place", re.compile(r"哪里|哪儿|何处|何地|什么地方|哪个?(?:国家|城市|省|地区|州|县|市|国)|在哪")),
    ("number", re.compile(r"多少|(?<![这那近前头哪])几[个次年天岁种位名人家条项倍块元角毛分万千百十]|多大(?!学)|多长|多高|多重|多远|多久|多深|多宽|百分之几|几成")),
    ("yesno", re.compile(r"吗[？?！!。]*$|吗[，,]|能不能|可不可以|行不行|要不要|是不是|算不算|能否|是否|可否|有没有|"
                         r"需不需要|用不用|会不会|让不让|给不给|准不准|许不许|合不合法|违不违法|有效吗|无效吗")),
]
# the bodies a rule names (「…人民政府」「…主管部门」「…委员会」)
_BODIES = r"人民政府|部门|机关|委员会|机构|人民法院|银行|单位"
# The words that decide a formal question of each kind (the clause holding them is the answer, and is bold). Not
# 应当 / 必须 for yes/no: nearly every clause of a regulation states a duty; the verdict is 不得, 免, 无偿, 可以 ….
DECIDING: dict[str, re.Pattern] = {
    "yesno": re.compile(r"不得|禁止|严禁|不准|不予|不应|无须|无需|不需|不必|不收|免[征收缴除费于予交]|无偿|"
                        r"可以|有权|无权|无效|有效|准予|允许|不实行|不适用|视为|不属于|属于"),
    "consequence": re.compile(r"责令|罚款|没收|吊销|撤销|追究|处分|警告|拘留|强制执行|承担[^，。；]{0,8}责任|赔偿|取消|"
                              r"停考|不予受理|处以|予以|暂停|关闭|取缔"),
    "body": re.compile(r"由[^，。；]{2,40}?(?:负责|审批|批准|核定|决定|鉴定|办理|发放|核发|管理|组织|实施)|"
                       rf"(?:{_BODIES})"),
}
# a lone 一 before a measure word is mostly the article (「一个种」), not a quantity; digits are read as whole numbers
# (「2,020万」 is not in a question about 「2006年」 although each of its digits is)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*|(?:[二三四五六七八九十百千万亿两〇零]|[一二三四五六七八九十百千万亿两〇零]{2,})"
                     r"(?:[个次年天岁种位名人家条项倍米公里吨元%％支号路届场座部本架艘辆只头件份篇首集所间层枚颗张台]|分之)")
# 「第十五条」「第二款」「第三章」 number a place in a document: a cross-reference or an article heading is no quantity
# (every sentence that opens its article would otherwise offer a number to 「多少钱」)
_REFERENCE = re.compile(r"第[一二三四五六七八九十百千零〇两\d]+[章节条款项编目]")
# a year written bare (「在 1835 开放」) or a numbered century (「19 世纪早期」) is a time too — a bare 1000–2099 unless a
# unit follows it: 「结算起点定为1000元」 is a sum
_NOT_YEAR = (r"(?![\d.]|\s*(?:多|余)?(?:万|千|百|亿)?(?:元|块|人|名|位|个|户|家|所|次|件|台|辆|艘|架|吨|公斤|千克|克|"
             r"米|公里|千米|平方|亩|公顷|立方|%|％|‰|倍|毫|瓦|伏|度|册|份|张|项|条|天|小时|分钟|秒|岁))")
_TIME = re.compile(r"\d{2,4}\s*年|\d{1,2}\s*月|\d{1,2}\s*日|\d{1,2}\s*世纪|(?<!\d)(?:1[0-9]|20)\d{2}" + _NOT_YEAR
                   + r"|世纪|年代|[一二三四五六七八九十〇零]{2,4}年|朝|时期|春|秋")
_POS = {"person": ("nr",), "place": ("ns",)}


_SENTENCE = re.compile(r"[^？?！!。]+[？?！!。]*")
_ENDS_MA = re.compile(r"吗[？?！!。\s]*$")


def _asked_part(question: str) -> str:
    """The question with the leading clauses of its 吗 sentences blanked: a question word there is indefinite —
    「公司里有几个回族员工，开斋节放假那天工资照发吗？」 says there are a few and asks yes or no (a sentence is
    asked either by its 吗 or by a question word, not both); 「能免费查几次吗」 keeps its 几, in the clause 吗 ends."""
    out = list(question)
    for m in _SENTENCE.finditer(question):
        sent = m.group(0)
        cut = max(sent.rfind("，"), sent.rfind(","))
        if cut > 0 and _ENDS_MA.search(sent):
            out[m.start():m.start() + cut] = "，" * cut
    return "".join(out)


def expected_kind(question: str) -> str | None:
    """'consequence' / 'body' / 'time' / 'person' / 'place' / 'number' / 'yesno', or None for questions of
    other kinds (什么, 为什么, 如何 …)."""
    asked = _asked_part(question or "")
    for kind, pat in _KINDS:
        if pat.search(asked):
            return kind
    return None


# The act a body question asks about, right after its question word: 「哪级政府负责？」 负责, 「是哪个部门在指导？」 指导,
# 「毕业证是哪个单位发的？」 发, 「找谁批？」 批 (来 / 在 / 去 … before it are no act; 「归谁？」「找谁？」 name none).
_ASKED_BODY = re.compile(r"(?:哪个?|哪一)(?:部门|机关|单位|机构|级(?:人民)?(?:政府|部门)?)|哪级(?:人民)?(?:政府|部门)?|谁")
_ASKED_ACT = re.compile(r"(?:来|在(?!场)|去|要|能|会|可以)?([\u4e00-\u9fff])([\u4e00-\u9fff])?")
_NO_ACT = frozenset("的了呢吗啊吧呀么")
# the bodies a rule names as the one who acts (a bare 「政府」 too: 「由乡政府批准」)
_ACTOR = re.compile(_BODIES + r"|政府")


def asked_act(question: str) -> str | None:
    """The act a 谁 / 哪个部门 question asks the actor of, or None when it names none."""
    asked = _asked_part(question or "")
    for m in _ASKED_BODY.finditer(asked):
        a = _ASKED_ACT.match(asked, m.end())
        if a and a.group(1) not in _NO_ACT:
            second = a.group(2) if a.group(2) and a.group(2) not in _NO_ACT else ""
            return a.group(1) + second
    return None


def names_actor(text: str, act: str) -> bool:
    """Does `text` name a body and then the act asked (「市、县级人民政府负责…」 for 「哪级政府负责？」, 「由一家开户银行
    负责现金管理工作，核定…限额」 for 「由谁核定？」)?"""
    m = _ACTOR.search(text)
    return m is not None and act in text[m.end():]


def in_document(kind: str | None, formal: bool) -> str | None:
    """The kind of answer a question asks of this document. A statute names bodies, not people or places: asked of a
    law, regulation or contract, 「该谁来改？」 and 「申请材料往哪儿递？」 want the party or authority its rule names
    (「由原…设计单位修改」, 「向…药品监督管理部门提出申请」), not a person's name or a place name, which it never holds."""
    return "body" if formal and kind in ("person", "place") else kind


def offers(kind: str | None, text: str, question: str, tagged: Callable[[str], list[tuple[str, str]]]) -> bool:
    """Does `text` hold an answer of this kind that the question itself does not contain?"""
    if kind is None:
        return False
    if kind in DECIDING:  # yes/no: 不得 / 可以 / 免 …; a penalty's 「可以处以…罚款」 is held back by sanction_unasked
        return holds_verdict(kind, text, question)
    if kind in ("number", "time"):
        pat = (_measure(question) or _NUMBER) if kind == "number" else _WHEN
        plain = _REFERENCE.sub("", text)
        if kind == "number" and sanction_unasked(kind, plain, question):
            plain = _without_sanctions(plain)
        if kind == "number" and pat is not _NUMBER:
            plain = _DATE.sub("", plain)
        elif kind == "number" and _COUNT.search(question):
            plain = _NOT_A_COUNT.sub("", _DATE.sub("", plain))
        return any(m.group(0) not in question for m in pat.finditer(plain))
    flags = _POS[kind]
    return any(flag.startswith(flags) and len(word) > 1 and word not in question for word, flag in tagged(text))


# A number question that names what it counts wants a number of that: 「几块钱」 an amount of money, 「多久」 a length
# of time, 「多少天」「最长签几年」 a length in that unit — a date, a count of articles, or 「期满前六个月」 for 「几年」 is no
# answer. (unit words asked → the units an answer may give them in)
# 「15」「2,400」「5.15」「三十」「半」 and what may follow the digits before the unit: 「30多年」「5.15亿年」「2,400万年」
# (「每半年」「半个月」 are lengths too)
_NUM = r"(?:\d+(?:[,，]\d{3})*(?:\.\d+)?|[一二三四五六七八九十百千万亿两〇零]+|半)\s*(?:[多余来])?(?:[万亿])?\s*"
_DURATION = r"(?:个)?(?:工作)?(?:日|天|周|星期|月|年|小时|分钟|秒)"
# the units a length asked in one may be given in: 「几天」 in 日 / 天 / 工作日, 「几周」 in 周 / 星期 …
_SAME_UNIT = {"年": r"周?年", "月": r"个?月", "周": r"(?:个)?(?:周|星期)", "星期": r"(?:个)?(?:周|星期)",
              "天": r"(?:个)?(?:工作)?(?:日|天)", "日": r"(?:个)?(?:工作)?(?:日|天)", "小时": r"(?:个)?(?:小时|钟头)",
              "分钟": r"分钟"}
# the amount a money question asks: a sum, or a fine stated as a multiple (「并处违法所得1倍以上3倍以下的罚款」, as
# Chinese legal drafting often does; 「责令补种盗伐株数10倍的树木」 is no amount)
_MONEY = (re.compile(r"(?:多少|几)(?:块|元|钱|万|千|百)|多少钱|什么价|多少费|罚多少"),
          re.compile(_NUM + r"(?:万|千|百)?(?:元|块)|" + _NUM + r"倍[^，。；]{0,12}?(?:罚款|罚金)"))
_LENGTH = re.compile(r"多久|多长时间")
_LENGTH_IN = re.compile(r"(?:多少|(?<![这那近前头哪])几)(?:个)?(?:工作)?(天|日(?![圆元币])|周|星期|月|年(?![级代龄])|小时|分钟)")


def _length(unit: str | None) -> re.Pattern:
    return re.compile(r"(?<![\d〇零])" + _NUM + (_SAME_UNIT[unit] if unit else _DURATION) + r"(?!\d)")


_LENGTHS = {unit: _length(unit) for unit in (None, *_SAME_UNIT)}
# 「什么时候去申请？」 is answered by a time counted from an event: 「在有效期届满前1个月」「驶离口岸前4小时内」「自…之日起
# 30日内」 — a length with the word that anchors it, before or after
_WHEN = re.compile("|".join([_TIME.pattern, r"(?:前|后|起|满|逾)\s*" + _LENGTHS[None].pattern,
                             _LENGTHS[None].pattern + r"(?:以?内|之内|以?前|之前|以?后|之后)"]))
# 「最多能有几个投资人？」「有多少人？」 ask a count: a length of time (「未逾3年」), a sum of money or a share is no answer
# to it, whatever else the sentence says (a bare 「150万」 still is)
_COUNT = re.compile(r"(?:多少|(?<![这那近前头哪])几)(?:个|名|位|家|所|座|只|头|辆|艘|架|种|项|次|人|户|件|台|部|本|条)")
_NOT_A_COUNT = re.compile("|".join([_LENGTHS[None].pattern, _NUM + r"(?:万|千|百)?(?:元|块)", _NUM + r"[%％‰]"]))


# a calendar date (「2001年6月16日」「1月1日」) is when, not how long
_DATE = re.compile(r"(?:\d{4}|[一二三四五六七八九〇零]{4})\s*年(?:\s*\d{1,2}\s*月(?:\s*\d{1,2}\s*日)?)?|"
                   r"\d{1,2}\s*月\s*\d{1,2}\s*日|[一二三四五六七八九十]{1,2}月[一二三四五六七八九十]{1,3}日")


@functools.lru_cache(maxsize=256)  # asked once per candidate sentence of the same question
def _measure(question: str) -> re.Pattern | None:
    """The pattern of an answer in the units the question asks for (money, a length of time), or None."""
    money, answer = _MONEY
    if money.search(question):
        return answer
    named = _LENGTH_IN.search(question)
    if named:
        return _LENGTHS[named.group(1)]
    return _LENGTHS[None] if _LENGTH.search(question) else None


# A sanction decides a question about what happens to someone (consequence); asked anything else — whether something
# is allowed, who decides, how long — a penalty clause restates the breach of a rule and crowds out the clause that
# states it (「违反本条例规定…由农业农村主管部门责令改正…罚款」 for 「自己杀年猪自己吃，也要去定点屠宰场吗？」). The
# sanctions Chinese legal drafting imposes, narrower than DECIDING["consequence"] (予以 / 撤销 / 赔偿 stand in rules of
# every kind); a question that names one itself (「会罚款吗」「受什么处分」) asks about it whatever its kind.
SANCTION = re.compile(r"责令|罚款|没收|吊销|追究[^，。；]{0,6}责任|处分|警告|拘留|处以")
_ASKS_SANCTION = re.compile(r"罚|处分|后果|责任|吊销|没收|警告|拘留|追究")


def sanction_unasked(kind: str | None, text: str, question: str) -> bool:
    """Does `text` impose a sanction on a question that does not ask about one?"""
    return (kind != "consequence" and _ASKS_SANCTION.search(question or "") is None
            and SANCTION.search(text) is not None)


_SANCTION_BREAKS = re.compile(r"[，,。；;：:]")


def _without_sanctions(text: str) -> str:
    """`text` less its clauses that impose a sanction: the amount of a fine (「处应缴纳土地复垦费1倍以上2倍以下的罚款」)
    is not the figure of a question that asks no sanction (「土地复垦费每亩收多少？」)."""
    return "，".join(text[a:b] for a, b in clauses(text, 1, _SANCTION_BREAKS) if not SANCTION.search(text[a:b]))


def kind_cue(kind: str | None, text: str, question: str, tagged: Callable[[str], list[tuple[str, str]]]) -> float:
    """The picker's answer-kind cue (weighed by w_type): +1 when `text` offers an answer of the kind asked, −1 when
    it answers with a sanction the question did not ask about, else 0."""
    return float(offers(kind, text, question, tagged)) - float(sanction_unasked(kind, text, question))


def holds_verdict(kind: str, text: str, question: str) -> bool:
    """Does `text` hold deciding words of this kind (DECIDING) that the question does not?"""
    pat = DECIDING.get(kind)
    return pat is not None and any(m.group(0) not in question for m in pat.finditer(text))


def figure_asked(kind: str | None, question: str) -> str | None:
    """The figure a question's deciding clause holds: its own kind for 多少 / 多久 / 何时, and a number for a
    consequence asked as an amount (「要罚多少？」「会罚多少钱？」: the fine's amount, not 「责令限期改正」)."""
    if kind in MUST_OFFER:
        return kind
    return "number" if kind == "consequence" and _MONEY[0].search(question or "") else None


# What an answer must hold for a question of these kinds: a number for 多少 / 几天, a date or year for 何时 / 哪一年
# — patterns, not judgement, so the check is as sure as the patterns are.
MUST_OFFER = ("number", "time")


def lacks_answer(kind: str | None, texts: list[str], question: str) -> bool:
    """A question of a MUST_OFFER kind whose quoted sentences hold no number / date the question lacks: the
    materials are about the matter asked, not the figure asked (「具体限额由中国人民银行规定」 for 「最多能带多少」)."""
    return kind in MUST_OFFER and not any(offers(kind, t, question, untagged) for t in texts)


def untagged(text: str) -> list[tuple[str, str]]:
    return []  # number and time offers are patterns: no part-of-speech tags needed
