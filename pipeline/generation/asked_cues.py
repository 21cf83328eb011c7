"""The answer-kind cue narrowed to what the question asks, among the candidates of one question.

answer_type.kind_cue judges a sentence alone. In a regulation nearly every clause names some body and many impose
a sanction, so 「城里房子征收是哪级政府负责？」 and 「把经营许可证借给朋友的公司用，被查到会怎样？」 were offered by
most candidates alike, and the cosine chose among them. Two rules read what the question asks and, while some
candidate of a formal document states it, take the offer from the others:
- a body question that names its act (answer_type.asked_act: 负责) is answered by the clause whose body does that
  act (「市、县级人民政府负责…」), not by one whose body does something else (「上级人民政府应当加强…监督」);
- a consequence question is answered by the sanction whose condition — the words before its first sanction — holds
  a word of the question (「旅行社转让、出租、出借旅行社业务经营许可证的，由…责令停业整顿」), not by the sanction of
  another breach (「拒不改正的，吊销…」, 「予以许可的，颁发…」).
When no candidate states it, the cue stays as it was: the act may be worded otherwise (「点头」 for 「确定」).
Lexical and parameter-free: the offers keep their weight (w_type); only which candidates hold one changes.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from pipeline.generation.answer_type import (
    DECIDING,
    asked_act,
    figure_asked,
    in_document,
    kind_cue,
    names_actor,
    offers,
)
from pipeline.generation.candidates import Candidate, Cues
from pipeline.generation.deciding import item_verdict
from pipeline.generation.sentences import Piece

MIN_TERM = 2  # a one-character word (罚, 用) is in too many conditions to say which breach is asked


def offer(cues: Cues, c: Candidate, pieces: Sequence[Piece], tagged: Callable[[str], list[tuple[str, str]]]) -> float:
    """A candidate's answer-kind cue (w_type's feature) before narrowing: answer_type.kind_cue of its text, and for a
    yes/no question +1 for a list item whose lead-in states the verdict (「军队医师不得有下列行为：」 decides 「(三)开展以
    牟利为目的的私人诊疗活动；」, which holds no deciding word of its own). A consequence asked as an amount (「…会罚多少
    钱？」) is offered only by a sanction that states one: 「…责令改正，给予警告，可以予以通报」 answers what happens, not
    how much. `pieces`: the answer units of its chunk."""
    cue = kind_cue(in_document(cues.kind, c.formal), c.piece.text, cues.question, tagged)
    amount = cues.kind == "consequence" and figure_asked(cues.kind, cues.question) == "number"
    if cue > 0 and amount and not offers("number", c.piece.text, cues.question, tagged):
        return 0.0
    if cue == 0 and cues.kind == "yesno" and item_verdict(pieces, c.piece.position, cues.question):
        return 1.0
    return cue


def stating(cues: Cues) -> Callable[[Candidate], bool] | None:
    """Does a candidate state what the question asks (the body doing the act asked, the sanction of the breach
    asked)? None when the question asks nothing these rules read. Asked of formal candidates only (`_keep`)."""
    kind = in_document(cues.kind, True)
    if kind == "body":
        act = asked_act(cues.question)
        if act is not None:
            return lambda c: names_actor(c.piece.text, act)
    elif kind == "consequence":
        terms = [t for t in cues.terms if len(t) >= MIN_TERM]
        if terms:
            return lambda c: any(t in sanction_condition(c.piece.text) for t in terms)
    return None


def narrow(cands: list[Candidate], cues: Cues) -> list[Candidate]:
    """`cands` with the offer kept only by those stating what the question asks, while any formal one does."""
    states = stating(cues)
    return cands if states is None else _keep(cands, states)


def sanction_condition(text: str) -> str:
    """The words before the first sanction of `text` (「…出借旅行社业务经营许可证的，由旅游行政管理部门」), "" when it
    imposes none."""
    m = DECIDING["consequence"].search(text)
    return text[:m.start()] if m else ""


def _keep(cands: list[Candidate], states: Callable[[Candidate], bool]) -> list[Candidate]:
    def offered(c: Candidate) -> bool:
        return c.formal and c.offers > 0

    holding = {id(c) for c in cands if offered(c) and states(c)}
    if not holding:
        return cands
    return [replace(c, offers=0.0) if offered(c) and id(c) not in holding else c for c in cands]
