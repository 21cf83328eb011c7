"""Sentences of a chunk, and which of them can be an answer (used by the extractive picker and the support check).

Chunks come from very different files: hard-wrapped novels (a line break every ~40 characters, mid-sentence),
contracts whose headings and list labels sit on their own lines (「2、乙方违约责任」), PDF tables flattened into
number runs. `split_sentences` first re-joins hard-wrapped lines, then splits at 。！？；!?; and at the line
breaks that remain. `is_statement` rejects what cannot answer anything: headings, list labels, title
fragments, lines without a sentence body, number/table debris.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_END = "。！？；!?;…"
_CLOSE = "”’」』）)】》"
_SPLIT = re.compile(r"([。！？；!?;]+[”’」』）)]?|\n+)")
_LABEL = re.compile(
    r"^\s*(?:第[一二三四五六七八九十百千零〇\d]+[章节条回部篇卷款项]|[一二三四五六七八九十]+[、.．]|"
    r"[（(][一二三四五六七八九十\d]+[）)]|\d+(?:\.\d+)*[、.．)）]?(?=\D)|[①-⑳]|[a-zA-Z][、.)）]|"
    r"[\uf000-\uf8ff•·●▪◆■□◇○◎★☆►▶→]+)\s*")
_TITLE = re.compile(r"《[^《》]*》")
_TAG = re.compile(r"\[[A-Za-z_]+\]")              # layout tags of converted PDFs: [Table_Main]
_BLANK = re.compile(r"[\s_＿…．.·-]{3,}")          # form fields left blank, dotted leaders
_DATE_END = re.compile(r"\d{4}[.\-/年]\d{1,2}(?:[.\-/月]\d{1,2}日?)?$")
_CJK = re.compile(r"[\u4e00-\u9fff]")
_CLAUSE = re.compile(r"[，,：:、]")

LONG_UNIT_CHARS = 200   # a sentence longer than the answer shows (extractive.MAX_SENTENCE_CHARS) is cut into
UNIT_CHARS = 100        # runs of whole clauses of at most this many characters (comma-only text; not fitted)
_RUN_BREAK = re.compile(r"[，,；;]")  # where a run of whole clauses may end (and a sentence the chunk cuts)
_INLINE_ARTICLE = re.compile(r"(?<=[ \t\u3000])(第[一二三四五六七八九十百千零〇\d]+条)(?=[ \t\u3000])")
MIN_BODY_CHARS = 6      # fewer Chinese characters than this (after a list label) is a fragment
HEADING_MAX_CHARS = 30  # a line without closing punctuation and without a clause break, this short: a heading
WRAP_MIN_CHARS = 20     # a line at least this long that ends mid-sentence is hard-wrapped (joined to the next)
MIN_CJK_SHARE = 0.3     # below this share of Chinese characters: tables, numbers, debris


@dataclass(frozen=True)
class Piece:
    text: str        # the sentence without its closing punctuation (stripped)
    punct: str       # closing punctuation ("" when it ended at a line break or the chunk end)
    position: int    # index within the chunk
    cut: bool = False  # the chunk ends inside this sentence (chunks are cut by size, not at sentence ends)


def unwrap(text: str) -> str:
    """Join lines broken mid-sentence (hard-wrapped text); keep breaks after headings and finished sentences."""
    lines = (text or "").split("\n")
    out: list[str] = []
    last = ""  # the previous physical line (out[-1] may already hold several joined ones)
    for line in lines:
        if out and out[-1] and line.strip():
            prev = last.rstrip()
            wrapped = (len(prev) >= WRAP_MIN_CHARS and prev[-1] not in _END + _CLOSE + "：:"
                       and not _DATE_END.search(prev)
                       and not _LABEL.match(line) and not line.startswith(("  ", "\u3000", "\t")))
            if wrapped:
                out[-1] = out[-1].rstrip() + line.strip()
                last = line
                continue
        out.append(line)
        last = line
    return "\n".join(out)


def split_sentences(text: str) -> list[Piece]:
    parts = _SPLIT.split(unwrap(text))
    out: list[Piece] = []
    for i in range(0, len(parts), 2):
        body = parts[i].strip()
        sep = parts[i + 1] if i + 1 < len(parts) else ""
        punct = "" if "\n" in sep else sep.strip()[:1]
        if body:
            # a closing quote after the punctuation belongs to the sentence
            tail = sep.strip()[-1:] if sep.strip()[-1:] in _CLOSE else ""
            out.append(Piece(body + tail, punct, len(out), cut=not sep and i + 1 >= len(parts)))
    return out


def strip_label(text: str) -> str:
    return _LABEL.sub("", text, count=1).strip()


def is_heading(p: Piece) -> bool:
    """A line of its own that titles what follows (「2、乙方违约责任」, 「第三十七回　…」): a new topic starts."""
    body = strip_label(p.text)
    if p.punct:
        return False
    if len(body) <= HEADING_MAX_CHARS and not _CLAUSE.search(body):
        return True
    return bool(_LABEL.match(p.text)) and p.text.lstrip()[:1] == "第" and len(body) <= 2 * HEADING_MAX_CHARS


def is_statement(p: Piece) -> bool:
    """Can this sentence answer a question? False for headings, labels, fragments, tables."""
    if p.cut and not p.text.endswith(tuple(_END)):
        return False  # the sentence goes on in the next chunk: what is here may stop mid-clause
    body = strip_label(p.text)
    cjk = len(_CJK.findall(body))
    if cjk < MIN_BODY_CHARS:
        return False
    if cjk / max(len(body.replace(" ", "")), 1) < MIN_CJK_SHARE:
        return False
    if sum(len(m) for m in _TITLE.findall(body)) > 0.5 * len(body) or (_TITLE.search(body) and
                                                                       _DATE_END.search(body)):
        return False  # a title or reference (「1.《高测股份：…业绩大超预期》，2022.4.29」), not a statement
    if body.count("《") != body.count("》"):
        return False  # a piece of a title cut by a line break
    if not p.punct and _DATE_END.search(body):
        return False  # a line ending in a date: a reference, a caption, a letterhead
    if _TAG.search(body) or body.endswith(("：", ":")):
        return False  # a layout tag line, or a label waiting for its value (「法定代表人（授权代表）：」)
    if sum(len(m) for m in _BLANK.findall(body)) > 0.3 * len(body):
        return False  # a form with blank fields
    if is_heading(p):
        return False  # a line of its own, short, no clause break: a heading or a title fragment
    return True


def clauses(text: str, min_chars: int = 4, breaks: re.Pattern = _CLAUSE) -> list[tuple[int, int]]:
    """(start, end) spans of the clauses of a sentence (split at ，：、 or at `breaks`), each at least min_chars
    long."""
    spans, start = [], 0
    for m in breaks.finditer(text):
        if m.start() - start >= min_chars:
            spans.append((start, m.start()))
        start = m.end()
    if len(text) - start >= min_chars:
        spans.append((start, len(text)))
    return spans


def answer_units(text: str) -> list[Piece]:
    """The sentences the extractive picker chooses from: split_sentences, and two cuts it does not make (the
    gate's sentence evidence keeps split_sentences, so it embeds no more sentences than it did):
    - at an article heading inside a line (「…的规定。 第三条 …」 of text flattened by a PDF or a paste): a new 第…条
      after whitespace starts a new sentence (a cross-reference 「依照第三条规定」 has no space after it);
    - comma-only text (court judgments, flattened tables of content: runs of hundreds of characters without 。):
      a sentence longer than LONG_UNIT_CHARS becomes runs of whole clauses of ≤ UNIT_CHARS, so the answer quotes
      the clause that answers instead of a paragraph cut off at 200 characters;
    and one it makes for a sentence the chunk cuts (`cut`: it goes on in the next chunk — in comma-only text, the
    last sentence of nearly every chunk): its whole clauses are runs like those above, and only the clause it stops
    inside stays a cut piece (no statement) — else up to LONG_UNIT_CHARS of every comma-only chunk could never be
    quoted (docs/retrieval-eval.md, `tools.eval.small_kb_check --commas`)."""
    pieces = split_sentences(_INLINE_ARTICLE.sub(r"\n\1", text or ""))
    if any(len(p.text) > LONG_UNIT_CHARS or p.cut for p in pieces):
        out: list[Piece] = []
        for p in pieces:
            whole, rest = _uncut(p.text) if p.cut else (p.text, "")
            runs = _clause_runs(whole) if p.cut or len(whole) > LONG_UNIT_CHARS else [whole]
            for k, run in enumerate(runs):  # whole clauses: none of them goes on in the next chunk
                last = k == len(runs) - 1 and not rest
                out.append(Piece(run, p.punct if last else "，", len(out)))
            if rest:
                out.append(Piece(rest, p.punct, len(out), cut=True))
        pieces = out
    return pieces


def _uncut(text: str) -> tuple[str, str]:
    """A sentence the chunk cuts (it goes on in the next chunk): (its whole clauses, the clause it stops in). In
    comma-only text the chunk nearly always ends inside a sentence, and that sentence (up to LONG_UNIT_CHARS) would
    otherwise be no statement at all (is_statement: it may stop mid-clause)."""
    breaks = [m.end() for m in _RUN_BREAK.finditer(text)]
    if not breaks:
        return "", text
    return text[:breaks[-1]], text[breaks[-1]:]


def _clause_runs(text: str) -> list[str]:
    """Runs of whole clauses (cut after ，,；) of at most UNIT_CHARS characters (a longer clause stays whole)."""
    parts = [x for x in re.split(rf"(?<={_RUN_BREAK.pattern})", text) if x]
    runs, cur = [], ""
    for part in parts:
        if cur and len(cur) + len(part) > UNIT_CHARS:
            runs.append(cur)
            cur = ""
        cur += part
    if cur:
        runs.append(cur)
    return [r.rstrip("，,；;").strip() for r in runs if r.strip("，,；; ")]
