"""Answer candidates: the statements of the top sources and the lexical evidence each holds about the question.

Two steps, so the calibration (tools/eval/calibrate_extractive.py) rebuilds exactly what the app scores from a dump:
`measure` records what one sentence shows on its own (which question words it contains, phrase share, focus
term), `assemble` turns the sentences of the top chunks into candidates — statements only, each once (chunk
overlap repeats sentences), with the IDF coverage and the context carried over from earlier sentences of the same
section (Chinese drops the topic once it is established; a heading opens a new section, so 「2、乙方违约责任」's
words do not carry past 「1、甲方违约责任」 into the other party's clauses).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.generation.answer_type import expected_kind
from pipeline.generation.sentences import Piece, is_heading, is_statement, strip_label
from pipeline.retrieval.lexical import TermWeights, content_bigrams, content_terms, focus_terms, normalize

PREFILTER_RANK_COST = 0.1
# The parties of contracts and agreements: a clause is about the party it starts with (「甲方逾期支付货款的，…」).
_PARTY = re.compile(r"(?:[甲乙丙丁]|买|卖|供|需|出租|承租|出卖|买受|委托|受托|发包|承包|借款|贷款|出借|转让|受让)方")


@dataclass(frozen=True)
class Cues:
    """What the picker looks for, from the question alone."""

    question: str
    terms: list[str]          # content words
    weights: list[float]      # their IDF in this knowledge base
    grams: list[str]          # content bigrams (phrase evidence)
    focus: list[str]          # what it asks about (lexical.focus_terms)
    kind: str | None          # the kind of answer it wants (answer_type.expected_kind)
    # IDF share of its words that some chunk of the knowledge base holds (TermWeights.visible_share): no sentence
    # can hold the rest (「钱被撕成两半了」 against 「残缺、污损的人民币」). 1.0 when it holds none of them (or there is
    # no index yet): with nothing to match, the floor stays as it is rather than being lifted without bound
    visible: float = 1.0

    @classmethod
    def of(cls, question: str, tokenizer, weights: TermWeights) -> "Cues":
        terms = content_terms(tokenizer(question))
        segments = tokenizer.segments(question)
        return cls(question, terms, [weights.idf(t) for t in terms], content_bigrams(segments),
                   focus_terms(segments), expected_kind(question), weights.visible_share(terms) or 1.0)

    def share(self, present: frozenset[int] | set[int]) -> float:
        """IDF share of the question's terms at these indices (lexical.coverage over index sets)."""
        total = sum(self.weights)
        return sum(self.weights[i] for i in present) / total if total else 0.0


@dataclass(frozen=True)
class Evidence:
    """One sentence of a chunk, measured against the question."""

    piece: Piece
    here: frozenset[int]      # indices of the question's terms it contains
    phrase: float             # share of the question's content bigrams in it
    focus: float              # 1 when it contains a focus term
    focus_part: float         # the best share of a focus term's characters in it (颜色 → 深褐色: 0.5)
    statement: bool


def focus_part(text: str, focus: Sequence[str]) -> float:
    """Partial focus evidence: 「主要呈什么颜色」 is answered by 「主要呈深褐色」, which names 色, not 颜色."""
    return max((sum(ch in text for ch in f) / len(f) for f in focus if f), default=0.0)


def measure(piece: Piece, cues: Cues) -> Evidence:
    text = normalize(piece.text)
    g = cues.grams
    return Evidence(piece, frozenset(i for i, t in enumerate(cues.terms) if t in text),
                    sum(x in text for x in g) / len(g) if g else 0.0, float(any(f in text for f in cues.focus)),
                    focus_part(text, cues.focus), is_statement(piece))


@dataclass(frozen=True)
class Candidate:
    piece: Piece
    source: int               # 1-based material number
    coverage: float
    phrase: float
    cosine: float | None = None
    context: float = 0.0      # IDF share of question words absent here but present earlier in its section
    focus: float = 0.0        # 1 when it contains a focus term of the question
    focus_part: float = 0.0   # Evidence.focus_part
    offers: float = 0.0       # answer_type.kind_cue: 1 it holds an answer of the kind asked that the question lacks,
                              # −1 a sanction the question did not ask about
    other_party: bool = False  # it is a clause about another party than the one the question asks about
    terms: frozenset[int] = frozenset()  # indices of the question's terms it contains (Evidence.here)
    doc: Any = None           # the document of its chunk (doc_id; None when unknown: one document)
    formal: bool = False      # its chunk has 第…条 article headings (a law, regulation, contract)
    cite: str = ""            # 《…》第十九条 when its chunk names the article (pipeline/generation/articles.py)
    lead: str = ""            # the lead-in of a list item (「下列项目免征增值税：」 above 「（一）…」), shown before it
    whole_article: bool = False  # its text is the whole article it belongs to (whole_article.py), not one sentence

    def prefilter_key(self) -> float:
        return self.coverage + self.phrase - PREFILTER_RANK_COST * (self.source - 1)


def to_embed(cands: Sequence[Candidate], prefilter: int) -> list[int]:
    """Indices of the candidates whose cosine is measured: the `prefilter` best by the cheap lexical order, and every
    one naming a focus term — what the question asks about. 「…借调去当经济普查员，这段时间工资谁发？」 is answered by
    「商调人员的工资由原单位支付」, which shares few of the long question's other words, so the cheap order alone ranks
    it 15th and it was never weighed. At most half as many again (the next by the cheap order): a focus word common in
    the sources says little, and each sentence embedded costs ≈ 7 ms on 2 cores."""
    order = sorted(range(len(cands)), key=lambda i: (-cands[i].prefilter_key(), cands[i].source, i))
    return order[:prefilter] + [i for i in order[prefilter:] if cands[i].focus][:prefilter // 2]


def other_party(text: str, question: str) -> bool:
    """「这份采购合同中，乙方逾期交货要承担什么违约责任？」 asks about 乙方: 「（2）甲方逾期支付货款的，…违约金」
    shares every word but is the other party's duty. True when the question names a party, the clause starts
    with one, and the question does not name that one."""
    asked = set(_PARTY.findall(question))
    m = _PARTY.match(strip_label(text))
    return bool(asked) and m is not None and m.group(0) not in asked


def assemble(chunks: Sequence[Sequence[Evidence]], cues: Cues) -> list[Candidate]:
    """Candidates of the chunks in rank order (source = rank), statements only, each sentence once."""
    out: list[Candidate] = []
    seen: set[str] = set()
    for rank, sentences in enumerate(chunks, start=1):
        earlier: set[int] = set()  # question words met in this section of the chunk so far
        for ev in sentences:
            key = "".join(ev.piece.text.split())
            if key not in seen and ev.statement:
                seen.add(key)
                carried = earlier - ev.here
                out.append(Candidate(ev.piece, rank, cues.share(ev.here), ev.phrase,
                                     context=cues.share(carried) if carried else 0.0, focus=ev.focus,
                                     focus_part=ev.focus_part,
                                     other_party=other_party(ev.piece.text, cues.question), terms=ev.here))
            earlier = set(ev.here) if is_heading(ev.piece) else earlier | ev.here
    return out
