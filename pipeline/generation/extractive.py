"""Extractive answers for when no LLM is configured: the sentences of the top sources that answer the question.

Candidates are the statements (pipeline/generation/sentences.py: no headings, list labels, title fragments,
table debris) of the top MAX_CHUNKS sources, with their lexical evidence (pipeline/generation/candidates.py).
Each is scored by
    w_cos · cos(question, sentence)          the loaded embedding model (e5: "query:" vs "passage:")
  + w_cov · coverage                         IDF-weighted share of the question's content words in it
  + w_phrase · phrase coverage               share of the question's character bigrams in it
  + w_focus · focus                          it names what the question asks about (lexical.focus_terms: 体长 in
                                             「前鼻丝鳗的体长是多少？」)
  + w_fpart · partial focus                  the best share of a focus term's characters in it (「什么颜色」 →
                                             「主要呈深褐色」)
  + w_context · context coverage             IDF share of the question's words it lacks but earlier sentences of
                                             its section have: Chinese drops the topic once established
                                             (「前鼻丝鳗，……的一个种。体长可达46.5公分。」 answers 「前鼻丝鳗的体长是多少？」)
  + w_type · offers                          it holds an answer of the kind asked that the question lacks (a
                                             person for 谁, a number for 多少 …; pipeline/generation/answer_type.py):
                                             a sentence that only restates the question does not answer it;
                                             − w_type when it imposes a sanction (罚款, 吊销 …) on a question
                                             that asks about none (answer_type.kind_cue); in a regulation, while
                                             some candidate states what is asked (the body doing the act asked, the
                                             sanction of the breach asked), only those offer (asked_cues.narrow);
                                             a list item offers the yes/no verdict of its lead-in (asked_cues.offer)
  − w_rank · (source number − 1)             a mild preference for the better-ranked source
Only the PREFILTER best candidates by a fixed cheap order (coverage + phrase coverage − 0.1 per source rank;
not fitted; on the dev sets the best-scoring sentence is inside it), and any other naming what the question asks
about (a focus term: candidates.to_embed), are embedded (≈ 7 ms a sentence on 2
cores) and part-of-speech tagged (≈ 2 ms). The answer is the best
sentence plus up to two more within `margin` of it that no sentence picked before already holds, in source order,
each cited [n]; the clause of the best sentence closest to the question is bold. In a formal document the best
sentence is quoted with the whole (short) article it belongs to (pipeline/generation/whole_article.py): an
article's clauses decide together.
When even the best sentence scores below `not_found_below` — measured above this knowledge base's background
(w_cos × the median best cosine of the gate's probe questions, pipeline/retrieval/gate_background.py), since e5
cosines shift by domain — no sentence addresses the question:
the answer says 「资料中未找到直接回答该问题的内容」 and points at the closest sources instead of quoting unrelated
sentences. The floor reads the best sentence's word shares over the question's words that some chunk of the
knowledge base holds (`visible_score`): a question typed in words the documents never use cannot have them in any
sentence. A best sentence that clears the floor only so is quoted under LOOSE_TEXT, as a weak answer. When the question asks for a figure (多少 / 多久: a number; 何时 / 哪一年: a date) and no quoted sentence
holds one the question lacks (answer_type.lacks_answer), the sentences are about the matter asked but not its
figure (「具体限额由中国人民银行规定」 for 「最多能带多少」): the answer says so in its first line (LACKS_TEXT) and is
weak (`done.weak`), whatever the gate decided — except in a formal document, which states its figures as figures:
there the rule holding the figure is not among the sources, and the answer is 「资料中未找到所问的具体数字」
(LACKS_NOT_FOUND) pointing at the sources it would have quoted — unless the quoted rule refers to another
article of its own document (「按本条例第五条第二款的规定执行」) that is among the sources and holds the figure: that
article's sentence is quoted beside it, bold (pipeline/generation/cross_reference.py). Weak too is an answer whose
best sentence hands the matter to a document the knowledge bases searched do not hold (「…依照《医疗事故处理条例》的相关规定执行」: pipeline/generation/referral.py;
ELSEWHERE_TEXT names it). Weights and thresholds belong to the embedding model (its
calibration profile, pipeline/calibration, section `extractive`); they are fitted with `python -m tools.eval.calibrate` (tools/eval/calibrate_extractive.py,
leave-one-set-out; docs/retrieval-eval.md). Without an embedding model (unit tests) the lexical part alone decides and "not found"
means no content word matches at all.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from difflib import SequenceMatcher
from itertools import groupby
from typing import Any, NamedTuple

import numpy as np

from pipeline.events import EXTRACTIVE_LABEL
from pipeline.generation.answer_type import SANCTION, figure_asked, in_document, kind_cue, lacks_answer
from pipeline.generation.articles import HEADING, LEADING_HEADING, articles_of, carried_article, citation
from pipeline.generation.asked_cues import narrow, offer
from pipeline.generation.candidates import Candidate, Cues, assemble, measure, to_embed
from pipeline.generation.cross_reference import referred_figure
from pipeline.generation.deciding import continued_lead_in, deciding_clause, lead_in
from pipeline.generation.instructions import is_instruction
from pipeline.generation.referral import handed_over_to, title_key
from pipeline.generation.sentences import answer_units, clauses
from pipeline.generation.whole_article import quote_article
from pipeline.models.vectors import TextVectors, unit
from pipeline.retrieval.lexical import TermWeights, normalize
from pipeline.retrieval.nodes import kb_ids_of, node_meta, node_text

VERIFIED_LABEL = "未配置大模型，以下为已核实问答"
MAX_CHUNKS = 6           # the sources the answer may quote (w_rank prefers the better-ranked ones)
MAX_SENTENCES = 3
MAX_SENTENCE_CHARS = 200
PREFILTER = 10           # candidates embedded per question
EMBED_CHARS = 96         # a longer sentence is embedded by its window of clauses that best covers the question:
                         # attention cost grows with the longest text of the batch (12 × 200 chars ≈ 7 × 12 × 40)
REPEAT_SHARE = 0.9       # a further sentence this much of which another picked one holds adds nothing
EARLIER_CHUNKS = 3       # chunks read back for the article a chunk starting inside one continues
NOT_FOUND_TEXT = "资料中未找到直接回答该问题的内容"
# the first line of an answer whose sentences are about the matter asked but hold no figure of the kind asked
LACKS_TEXT = {"number": "资料中没有给出所问的具体数字，以下是最相关的原文，请核对：",
              "time": "资料中没有给出所问的具体时间，以下是最相关的原文，请核对："}
# the answer from formal documents whose quoted articles hold no figure of the kind asked (a not-found answer)
LACKS_NOT_FOUND = {"number": "资料中未找到所问的具体数字", "time": "资料中未找到所问的具体时间"}
# the first line of an answer whose best sentence hands the matter to a document the knowledge base does not hold
ELSEWHERE_TEXT = "资料中的规定指向《{title}》，这份文件不在知识库中；以下是最相关的原文，请核对："
# the first line of an answer whose best sentence clears the not-found floor only on the words the KB holds
LOOSE_TEXT = "资料中没有与问题的说法直接对应的句子，以下是最接近的原文，请核对："
_PRIVATE_USE = re.compile(r"[\uf000-\uf8ff]")


@dataclass(frozen=True)
class PickerParams:
    w_cos: float
    w_cov: float
    w_phrase: float
    w_rank: float
    margin: float           # further sentences must score within this of the best
    not_found_below: float  # best score − w_cos·background median below this → 「资料中未找到直接回答该问题的内容」
    w_context: float = 0.0
    w_focus: float = 0.0
    w_fpart: float = 0.0    # partial focus (candidates.focus_part)
    w_type: float = 0.0     # offers an answer of the kind asked (answer_type)

    @classmethod
    def from_calibration(cls, section) -> "PickerParams":
        """The picker of a calibration profile (its `extractive` section)."""
        return cls(**section.params())


# No embedding model: lexical only; "not found" = not one content word of the question in any candidate. Not
# fitted (no cosine to weigh against): the lexical evidence alone, phrase and word coverage alike.
LEXICAL = PickerParams(w_cos=0.0, w_cov=1.0, w_phrase=1.0, w_rank=0.1, margin=0.3, not_found_below=1e-9)


def _lexical(c: Candidate, p: PickerParams) -> float:
    return (p.w_cov * c.coverage + p.w_phrase * c.phrase + p.w_context * c.context + p.w_focus * c.focus
            + p.w_fpart * c.focus_part + p.w_type * c.offers - p.w_rank * (c.source - 1))


def score(c: Candidate, p: PickerParams) -> float:
    return _lexical(c, p) + (p.w_cos * c.cosine if c.cosine is not None else 0.0)


def visible_score(c: Candidate, p: PickerParams, visible: float) -> float:
    """The score with the word shares (coverage, context) counted over the question's words that some chunk of
    the knowledge base holds (`visible`: their IDF share): a word no chunk holds is in no sentence, so a question
    typed in words the documents never use (「钱被撕成两半了」 for 「残缺、污损的人民币」) cannot reach the not-found
    floor on coverage that no sentence could give. Only the floor reads it; the ranking stays `score`."""
    v = min(max(visible, 1e-6), 1.0)
    return (score(c, p) + p.w_cov * (min(1.0, c.coverage / v) - c.coverage)
            + p.w_context * (min(1.0, c.context / v) - c.context))


@dataclass(frozen=True)
class Pick:
    sentences: list[Candidate]       # the answer, in source order
    best: Candidate | None
    bold: tuple[int, int] | None     # span of best.piece.text to bold
    found: bool
    score: float | None
    closest: list[int]               # sources to point at when nothing was found
    lacks: str | None = None         # the kind asked (number / time) that no quoted sentence holds (answer_type)
    elsewhere: str | None = None     # the document the best sentence hands the matter to, not in the KB (referral)
    loose: bool = False              # the best sentence clears the not-found floor only on the words the KB holds


def _uniform(kb_ids: Sequence[int]) -> TermWeights:
    return TermWeights.uniform()


def _no_background(kb_ids: Sequence[int]) -> None:
    return None


class ExtractivePicker:
    """Scores and picks answer sentences. `weights_of(kb_ids)` gives the live IDF table of the knowledge bases the
    sources come from (pipeline.retrieval.lexical), `background(kb_ids)` the gate's background of those. With an
    embedding model, `params` are that model's (PickerParams.from_calibration of its profile); without one the
    lexical picker runs."""

    def __init__(self, tokenizer: Any, embed_model: Any = None,
                 weights_of: Callable[[Sequence[int]], TermWeights] = _uniform, params: PickerParams | None = None,
                 prefilter: int = PREFILTER, max_chunks: int = MAX_CHUNKS,
                 background: Callable[[Sequence[int]], Any] = _no_background, vectors: TextVectors | None = None,
                 holds_document: Callable[[str, Sequence[int]], bool] | None = None,
                 earlier: Callable[[int, int], list[str]] | None = None):
        self.background = background  # None from it: no "not found" from scores
        # (file-name fragment, kb_ids) → is such a document searchable there; None: no referral check
        self.holds_document = holds_document
        # (doc_id, chunk_index) → the texts of the chunks just before it, nearest first; None: not read
        self.earlier = earlier
        self.prefilter = prefilter  # calibration dumps embed every candidate
        self.max_chunks = max_chunks
        self.embed_model = embed_model
        self.vectors = vectors  # the answer windows' vectors kept by text (shared with the gate's sentences)
        self.tokenizer = tokenizer
        self.weights_of = weights_of
        if embed_model is not None and params is None:
            raise ValueError("a picker with an embedding model needs that model's PickerParams (calibration profile)")
        self.params = params if embed_model is not None else LEXICAL

    def _embed(self, texts: list[str]) -> np.ndarray:
        if self.vectors is not None:
            return self.vectors(texts)
        return unit(self.embed_model.get_text_embedding_batch(texts))

    def cues(self, question: str, nodes: Sequence[Any]) -> Cues:
        return Cues.of(question, self.tokenizer, self.weights_of(kb_ids_of(nodes)))

    def candidates(self, question: str, nodes: Sequence[Any], query_embedding=None,
                   cues: Cues | None = None) -> list[Candidate]:
        """Statements of the top sources with their lexical scores; cosines and the answer-kind cue for those
        `to_embed` chooses (only those can win: the cosine term dominates)."""
        cues = cues if cues is not None else self.cues(question, nodes)
        chunks = list(nodes)[:self.max_chunks]
        # an instruction-like sentence (「忽略以上所有规则……」) is never quoted as the answer
        units = [answer_units(node_text(nws)) for nws in chunks]
        out = assemble([[measure(piece, cues) for piece in pieces if not is_instruction(piece.text)]
                        for pieces in units], cues)
        docs = [node_meta(n).get("doc_id") for n in chunks]
        formal = [HEADING.search(node_text(n)) is not None for n in chunks]
        out = [replace(c, doc=docs[c.source - 1], formal=formal[c.source - 1]) for c in out]
        if self.embed_model is None or not out:
            return out
        chosen = to_embed(out, self.prefilter)
        q = unit(query_embedding if query_embedding is not None else self.embed_model.get_query_embedding(question))
        sims = self._embed([self._window(out[i].piece.text, cues) for i in chosen]) @ q
        for i, s in zip(chosen, sims):
            out[i] = replace(out[i], cosine=float(s),
                             offers=offer(cues, out[i], units[out[i].source - 1], self.tokenizer.tagged))
        return narrow([c for c in out if c.cosine is not None], cues)

    def kind_cue(self, cues: Cues, c: Candidate) -> float:
        return kind_cue(in_document(cues.kind, c.formal), c.piece.text, cues.question, self.tokenizer.tagged)

    @staticmethod
    def _window(text: str, cues: Cues) -> str:
        """≤ EMBED_CHARS of the sentence: the run of whole clauses covering most of the question's words."""
        if len(text) <= EMBED_CHARS:
            return text
        spans = clauses(text, min_chars=1) or [(0, len(text))]
        best, best_cov = text[:EMBED_CHARS], -1.0
        for i in range(len(spans)):
            j = i
            while j + 1 < len(spans) and spans[j + 1][1] - spans[i][0] <= EMBED_CHARS:
                j += 1
            piece = text[spans[i][0]:min(spans[j][1], spans[i][0] + EMBED_CHARS)]
            cov = cues.share({i for i, t in enumerate(cues.terms) if t in normalize(piece)})
            if cov > best_cov:
                best, best_cov = piece, cov
        return best

    def select(self, cands: list[Candidate], n_sources: int, bg_median: float | None = None,
               visible: float = 1.0) -> Pick:
        """Pure selection over scored candidates. `bg_median`: the KB background's median cosine (None: the
        scores alone cannot tell "not found", only a lexical-only picker's zero overlap does). `visible`: the
        question's visible share (Cues.visible)."""
        p = self.params
        closest = list(range(1, min(n_sources, 3) + 1))
        if not cands:
            return Pick([], None, None, False, None, closest)
        # a clause about another party than the one asked about is no answer while one about that party is there
        cands = [c for c in cands if not c.other_party] or cands
        ranked = sorted(cands, key=lambda c: (-score(c, p), c.source, c.piece.position))
        best = ranked[0]
        top = score(best, p)
        offset = p.w_cos * bg_median if bg_median is not None else 0.0
        loose = False
        if (bg_median is not None or p.w_cos == 0) and top - offset < p.not_found_below:
            if visible_score(best, p, visible) - offset < p.not_found_below:
                return Pick([], best, None, False, top, closest)
            loose = True  # clears the floor only on the words the KB holds: quoted, and the answer says so
        picked = stay_in_document(best, _distinct([c for c in ranked if score(c, p) >= top - p.margin]))
        picked.sort(key=lambda c: (c.source, c.piece.position))
        return Pick(picked, best, None, True, top, closest, loose=loose)

    def pick(self, question: str, nodes: Sequence[Any], query_embedding=None,
             kb_ids: Sequence[int] | None = None) -> Pick:
        """The answer sentences. `kb_ids`: the knowledge bases searched (None: those of the sources), where a
        document the best sentence hands the matter to is looked for."""
        nodes = list(nodes)
        scope = kb_ids_of(nodes)
        bg = self.background(scope)
        cues = self.cues(question, nodes)
        result = self.select(self.candidates(question, nodes, query_embedding, cues), len(nodes),
                             bg.sim_median if bg is not None else None, cues.visible)
        if result.found and result.best is not None:
            result = _with_sources(result, nodes, self.earlier)
            kind = cues.kind
            result = replace(result, bold=self._bold_span(result.best, cues),
                             elsewhere=self._elsewhere(result.best, list(kb_ids or scope)))
            sentences, best, bold = quote_article(result.sentences, result.best, result.bold, nodes)
            # the figure is looked for in what the answer quotes: the deciding article whole holds 「…之日起20个
            # 工作日内…」 although the sentence the picker chose from it (its last one) does not
            # …in the deciding rule's own document: in a law the figure asked belongs to the rule that decides, not
            # to a side sentence of another law quoted beside it (「…增值税起征点的，免征增值税」 for 「…交个税？每月
            # 起征点是多少？」, with 「欠缴税款5万元以上」 of the tax-collection rules added)
            held = [c for c in sentences if not best.formal or c.doc == best.doc]
            lacks = kind if lacks_answer(kind, [c.piece.text for c in held], question) else None
            referred = referred_figure(kind, question, sentences, nodes) if lacks and best.formal else []
            if referred:  # the figure stands in the article the quoted rule refers to (「按本条例第五条第二款…」)
                first = referred[0]
                spans = deciding_clause(question, first.piece.text, kind)
                return replace(result, sentences=sorted([*sentences, *referred],
                                                        key=lambda c: (c.source, c.piece.position)),
                               best=first, bold=spans[0] if spans else None)
            if lacks and not result.elsewhere and (best.formal or best.cite):  # cite: a chunk inside an article
                # a law or a contract states its figures as figures: when the articles quoted hold none of the kind
                # asked, the rule that does is not among the sources (in the knowledge base or not) — not found,
                # the sources quoted pointed at, rather than a neighbouring rule under a banner. (A best sentence
                # that hands the matter to a document the KB lacks says more — where the rule is — and stays.)
                return replace(result, sentences=[], found=False, lacks=lacks,
                               closest=sorted({c.source for c in sentences})[:len(result.closest)])
            result = replace(result, sentences=sentences, best=best, bold=_figure_bold(question, kind, best, bold),
                             lacks=lacks)
        return result

    def _elsewhere(self, best: Candidate, scope: Sequence[int]) -> str | None:
        """The document the best sentence hands the matter to, when the knowledge bases searched lack it."""
        title = handed_over_to(best.piece.text)
        if title is None or self.holds_document is None or not scope:
            return None
        return None if self.holds_document(title_key(title), scope) else title

    @staticmethod
    def _bold_span(best: Candidate, cues: Cues) -> tuple[int, int] | None:
        """The clause of the best sentence that shares most of the question's words and phrases (the whole
        sentence when it has one clause). Lexical, not embedded: a second embedding batch would cost ~10–40 ms."""
        text = best.piece.text
        spans = clauses(text)
        if len(spans) <= 1 or best.lead:  # a list item under its lead-in (which holds the verdict): the item
            return (0, len(text)) if text else None
        # a formal question's verdict: the clause with the deciding words (「不得…」「…三十日内」「由…负责」)
        deciding = (_figure_clauses(cues.question, cues.kind, text)
                    or deciding_clause(cues.question, text, in_document(cues.kind, best.formal)))
        spans = deciding or spans
        if len(spans) == 1:
            return spans[0]
        grams = cues.grams

        def score(span):
            part = normalize(text[span[0]:span[1]])
            words = cues.share({i for i, t in enumerate(cues.terms) if t in part})
            return words + (sum(g in part for g in grams) / len(grams) if grams else 0.0)

        chosen = max(spans, key=score)
        if not deciding:  # no clause holds deciding words: the choice was by shared words, maybe a condition's
            chosen = _with_consequent(text, spans, chosen)
        return chosen


_CONDITION_END = re.compile(r"(?:的|时|前|后|的时候)$")


def _with_consequent(text: str, spans: list[tuple[int, int]], chosen: tuple[int, int]) -> tuple[int, int]:
    """A condition (「登记证和代表证遗失或者毁坏的」, 「…参加国际体育比赛时」) is not what decides; the clause after it
    is (「代表机构应当在指定的媒体上声明作废」): the bold runs on through that one clause."""
    i = spans.index(chosen)
    if i + 1 < len(spans) and _CONDITION_END.search(text[chosen[0]:chosen[1]].rstrip("，,；; ")):
        return (chosen[0], spans[i + 1][1])
    return chosen


def _figure_clauses(question: str, kind: str | None, text: str) -> list[tuple[int, int]]:
    """The clauses of `text` holding the figure a question asks (answer_type.figure_asked); for an amount of a
    consequence, only those imposing the sanction (「并处2万元以上10万元以下罚款」, not the condition 「违法经营额1万元
    以上的」)."""
    figure = figure_asked(kind, question)
    if figure is None:
        return []
    spans = deciding_clause(question, text, figure)
    return [sp for sp in spans if SANCTION.search(text[sp[0]:sp[1]])] if figure != kind else spans


def _figure_bold(question: str, kind: str | None, best: Candidate, bold: tuple[int, int] | None
                 ) -> tuple[int, int] | None:
    """A whole article quoted for a figure asked: when the clause bold holds no figure of the kind asked and another
    clause of the article does (「…自私募基金募集完毕之日起20个工作日内…」), that clause is the one that decides."""
    figure = figure_asked(kind, question)
    if figure is None or bold is None or not best.whole_article:
        return bold
    text = best.piece.text
    held = text[bold[0]:bold[1]]
    if not lacks_answer(figure, [held], question) and (figure == kind or SANCTION.search(held)):
        return bold
    spans = _figure_clauses(question, kind, text)
    return spans[0] if spans else bold


def _distinct(ranked: list[Candidate]) -> list[Candidate]:
    """Up to MAX_SENTENCES of `ranked`, in order, each one that no sentence picked before it already holds:
    overlapping chunks hold the same clauses, and in comma-only text they are cut into runs at other places, so the
    same words come back as another candidate (exact repeats are dropped when candidates are assembled; a run that
    goes on past the other adds to it and stays)."""
    out: list[Candidate] = []
    for c in ranked:
        if len(out) == MAX_SENTENCES:
            break
        if not any(_within(c.piece.text, x.piece.text) for x in out):
            out.append(c)
    return out


def _within(text: str, other: str) -> bool:
    """Is all of `text` but a few characters (its clause break, a cut word: REPEAT_SHARE) a run of `other`?"""
    m = SequenceMatcher(None, text, other, autojunk=False).find_longest_match(0, len(text), 0, len(other))
    return m.size >= REPEAT_SHARE * len(text)


def stay_in_document(best: Candidate, picked: list[Candidate]) -> list[Candidate]:
    """When the best sentence comes from a formal document (its chunk has 第…条 article headings), that document
    answers; a sentence of another document stays only when it adds question words the picked sentences of that
    document lack (it adds to the answer, not a neighbouring rule beside it). Not for other text: web paragraphs
    of one search are near-paraphrases stored as separate documents, and there the other paragraph's sentence is
    often the one holding the answer (applied everywhere, the rule cost dureader_dev 6 of 99 answer-hits)."""
    if not best.formal:
        return picked
    own = [c for c in picked if c.doc == best.doc]
    covered = frozenset().union(*(c.terms for c in own))
    return own + [c for c in picked if c.doc != best.doc and c.terms - covered]


def _with_sources(pick: Pick, nodes: Sequence[Any], earlier: Callable[[int, int], list[str]] | None = None) -> Pick:
    """The picked sentences with what their chunk says about them: the article they sit under (《…》第十九条) and
    the lead-in of a list item (its verdict: 「下列项目免征增值税：」 above 「（一）…」). Display only: scoring items
    as lead-in + item was tried and lost 3 of 138 regulations_dev answers (every item of a list then scores alike
    and crowds out the sentence that answers). `earlier` reads the chunks before a chunk that starts inside an
    article, for the article its first sentences belong to (and the lead-in of a list cut there)."""
    units: dict[int, tuple[list, dict[int, str]]] = {}  # per source: its pieces and the article of each
    changed: dict[int, Candidate] = {}
    earlier = functools.cache(earlier) if earlier is not None else None  # one read per chunk of this answer
    for c in pick.sentences:
        n = nodes[c.source - 1]
        if c.source not in units:
            pieces = answer_units(node_text(n))
            units[c.source] = pieces, articles_of(node_text(n), pieces)
        pieces, articles = units[c.source]
        article = articles.get(c.piece.position, "")
        lead = lead_in(pieces, c.piece.position)
        above = None if article else _above(c, n, earlier)
        if above is not None:  # the chunk starts inside an article: its heading (and a list's lead-in) came before
            head, before = above
            article = carried_article(head, before)
            if article and not lead and before:
                lead = continued_lead_in(head, c.piece.text, before[0])
        changed[id(c)] = replace(c, cite=citation(node_meta(n).get("doc_name"), article),
                                 lead=LEADING_HEADING.sub("", lead) if article else lead)
    return replace(pick, sentences=[changed[id(c)] for c in pick.sentences],
                   best=changed.get(id(pick.best), pick.best))


def _above(c: Candidate, node: Any, earlier: Callable[[int, int], list[str]] | None) -> tuple[str, list[str]] | None:
    """(the chunk's text above the sentence, the texts of the chunks before it, nearest first), or None: no store to
    read, a re-joined sentence (not verbatim in its chunk), or the document's first chunk."""
    meta, text = node_meta(node), node_text(node)
    at = text.find(c.piece.text[:12])
    if earlier is None or at < 0 or meta.get("doc_id") is None or not meta.get("chunk_index"):
        return None
    return text[:at], earlier(int(meta["doc_id"]), int(meta["chunk_index"]))


def render_sentence(c: Candidate, bold: tuple[int, int] | None = None) -> str:
    text = c.piece.text
    head = LEADING_HEADING.match(text) if c.cite else None
    if head:  # 「第二十二条 办理…」 under the citation naming 第二十二条: the heading once
        cut = head.end()
        text = text[cut:]
        bold = (max(bold[0] - cut, 0), bold[1] - cut) if bold is not None and bold[1] > cut else None
        c = replace(c, piece=replace(c.piece, text=text))
    return render_items([c], [bold])


def render_items(items: Sequence[Candidate], bolds: Sequence[tuple[int, int] | None]) -> str:
    """One answer line: the citation, the lead-in, then the sentences — one, or items of one list under one lead-in
    (same source, article and lead-in) joined by 「；」, the lead-in once: 「- 《…》第三十五条：单采血浆站有下列行为之一的，
    …：……(九)…；(十)…[1]。」 rather than the lead-in again before each item."""
    first = items[0]
    prefix = (f"{first.cite}：" if first.cite else "") + (f"{first.lead}……" if first.lead else "")
    return f"- {prefix}{'；'.join(_body(c, b) for c, b in zip(items, bolds))}[{first.source}]{_end(items[-1])}"


def _body(c: Candidate, bold: tuple[int, int] | None) -> str:
    body = _PRIVATE_USE.sub("", c.piece.text).strip() if bold is None else c.piece.text
    if bold is not None:
        a, b = bold
        inner = body[a:b].strip()
        body = (body[:a] + (f"**{inner}**" if inner else "") + body[b:])
        body = _PRIVATE_USE.sub("", body).strip()
    if len(body) > MAX_SENTENCE_CHARS and not c.whole_article:  # a whole article was bounded when it was made
        body = body[:MAX_SENTENCE_CHARS].rstrip("*").rstrip() + "……" + ("**" if body.count("**") % 2 else "")
    return body


def _end(c: Candidate) -> str:
    return {"！": "！", "!": "！", "？": "？", "?": "？"}.get(c.piece.punct, "。")


class Extract(NamedTuple):
    deltas: list[str]   # the answer text in pieces, label first
    cited: set[int]     # material numbers it cites
    lacks: str | None   # Pick.lacks: the answer says so in its first line, and is a weak one
    elsewhere: str | None = None  # Pick.elsewhere: the same, for a rule in a document the KB does not hold
    loose: bool = False  # Pick.loose: the same, for sentences that match the question only on the words the KB holds
    not_found: str | None = None  # the 「资料中未找到…」 the answer says instead of quoting: a refusal (done.no_answer)

    @property
    def weak(self) -> bool:
        return self.lacks is not None or self.elsewhere is not None or self.loose


def render(pick: Pick) -> Extract:
    """The deltas of an extractive answer (label first), the cited material numbers and what it lacks."""
    deltas = [f"{EXTRACTIVE_LABEL}：\n"]
    if not pick.found:
        refs = "".join(f"[{n}]" for n in pick.closest)
        text = LACKS_NOT_FOUND[pick.lacks] if pick.lacks else NOT_FOUND_TEXT
        deltas.append(f"{text}。最接近的资料见 {refs}，请查看原文。" if refs else f"{text}。")
        return Extract(deltas, set(pick.closest), None, not_found=text)
    if pick.elsewhere:  # says more than a missing figure: where the rule is
        deltas.append(ELSEWHERE_TEXT.format(title=pick.elsewhere) + "\n")
    elif pick.loose:  # the quoted sentences may not be about the matter asked at all: before a missing figure
        deltas.append(LOOSE_TEXT + "\n")
    elif pick.lacks:
        deltas.append(LACKS_TEXT[pick.lacks] + "\n")
    whole = pick.best is not None and pick.bold == (0, len(pick.best.piece.text))
    # the best clause is bold; a one-clause sentence only when other sentences stand beside it
    bolds = [pick.bold if c is pick.best and not (whole and len(pick.sentences) == 1) else None
             for c in pick.sentences]
    lines = []
    # neighbouring items of one list (same source, article and lead-in) make one line; any other sentence its own
    for _, run in groupby(zip(pick.sentences, bolds), key=lambda cb: (cb[0].source, cb[0].cite, cb[0].lead)
                          if cb[0].lead else id(cb[0])):
        cs, bs = zip(*run)
        lines.append(render_sentence(cs[0], bs[0]) if len(cs) == 1 else render_items(cs, bs))
    deltas += [line + "\n" for line in lines[:-1]] + lines[-1:]
    return Extract(deltas, {c.source for c in pick.sentences}, pick.lacks, pick.elsewhere, pick.loose)


def extractive_deltas(question: str, nodes: Sequence[Any], picker: ExtractivePicker, query_embedding=None,
                      kb_ids: Sequence[int] | None = None) -> Extract:
    """The deltas of an extractive answer (label first), the cited material numbers and what it lacks.

    When the best source is a verified Q&A entry, its checked answer is the reply (quoting sentences of it
    would start with its own 「问：」 line)."""
    nodes = list(nodes)
    if nodes and (getattr(nodes[0], "node", nodes[0]).metadata or {}).get("verified"):
        from pipeline.conversation.verified import answer_of

        return Extract([f"{VERIFIED_LABEL}：\n", f"{answer_of(node_text(nodes[0]))}[1]"], {1}, None)
    return render(picker.pick(question, nodes, query_embedding, kb_ids=kb_ids))
