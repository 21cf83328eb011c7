"""The public dev sets and their gold: loaders of CMRC 2018 / XQuAD (SQuAD format) and DuReader, and the tests of
whether a retrieved chunk or an answer sentence holds the gold answer.

The leaf of tools/: it imports nothing of tools (nor of the pipeline), so every evaluation, calibration and
benchmark can import it. The dev data is read in place from $KBQA_SHARED_DATA or ../shared/data (never copied).
"""
from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

_WS = re.compile(r"\s+")


def norm(text: str) -> str:
    """Whitespace removed (\\s covers the ideographic space U+3000 the texts use after headings)."""
    return _WS.sub("", text)


REPO = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    env = os.environ.get("KBQA_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


@dataclass
class Question:
    text: str
    gold_docs: set[str]  # keys of gold documents
    answers: list[str] = field(default_factory=list)  # empty → any chunk of a gold doc is a hit
    # the regulations set's spans may run over a line break: they match with whitespace removed from both sides
    whitespace_free: bool = False

    def held_by(self, text: str) -> bool:
        """Does a chunk's text hold one of the gold answers (any text when the question has none)?"""
        if not self.answers:
            return True
        if self.whitespace_free:
            text = norm(text)
        return any(a in text for a in self.answers)


@dataclass
class Corpus:
    docs: dict[str, str]  # key → text
    questions: list[Question]


def load_squad(path: Path, limit: int | None, seed: int = 13, max_contexts: int | None = None) -> Corpus:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    docs, qs = {}, []
    for art in data["data"]:
        for pi, para in enumerate(art["paragraphs"]):
            key = f"{art.get('title', 'doc')}#{pi}#{len(docs)}"
            docs[key] = para["context"]
            for qa in para["qas"]:
                ans = [a["text"] for a in qa.get("answers", []) if a.get("text")]
                if ans:
                    qs.append(Question(qa["question"], {key}, ans))
    if limit and limit < len(qs):
        rnd = random.Random(seed)
        qs = rnd.sample(qs, limit)
    if max_contexts and max_contexts < len(docs):
        # Smaller corpus (CI): every gold context of the kept questions plus random others.
        gold = {k for q in qs for k in q.gold_docs}
        others = [k for k in docs if k not in gold]
        extra = random.Random(seed).sample(others, max(0, min(len(others), max_contexts - len(gold))))
        docs = {k: v for k, v in docs.items() if k in gold or k in set(extra)}
    return Corpus(docs, qs)


def load_dureader(path: Path, limit: int | None) -> Corpus:
    docs, qs = {}, []
    with open(path, encoding="utf-8") as f:
        for li, line in enumerate(f):
            d = json.loads(line)
            gold = set()
            for di, doc in enumerate(d["documents"]):
                for pj, para in enumerate(doc["paragraphs"]):
                    if not para.strip():
                        continue
                    key = f"q{li}d{di}p{pj}"
                    docs[key] = para
                    if di in d.get("answer_docs", []) and pj == doc.get("most_related_para"):
                        gold.add(key)
            if gold:
                qs.append(Question(d["question"], gold, []))
            if limit and len(qs) >= limit:
                break
    return Corpus(docs, qs)


def add_distractors(corpus: Corpus, path: Path, n: int | None) -> None:
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if n is not None and i >= n:
                break
            if line.strip():
                corpus.docs[f"news#{i}"] = line.strip()


@dataclass(frozen=True)
class DevSet:
    name: str
    kind: str  # "squad" | "dureader" | "folder" (documents only: every *.md of the folder but README.md)
    path: str  # relative to the shared data dir
    distractors: str | None = None
    style: str = ""  # what kind of questions, for the report


DEV_SETS: dict[str, DevSet] = {s.name: s for s in (
    DevSet("xquad_zh", "squad", "xquad/xquad.zh.json", style="annotator questions, Wikipedia passages"),
    DevSet("cmrc_trial", "squad", "cmrc2018/cmrc2018_trial.json", style="annotator questions, Wikipedia"),
    DevSet("dureader_dev", "dureader", "dureader2_demo/search.dev.json", style="real search questions, web"),
    DevSet("dureader_train", "dureader", "dureader2_demo/search.train.json", style="real search questions, web"),
    DevSet("cmrc_dev_news", "squad", "cmrc2018/cmrc2018_dev.json", "crud_rag_news/documents_dup_part_1_part_1",
           style="annotator questions, Wikipedia + news distractors"),
)}  # smallest first: a build run in this order has the quick sets ready early

# Kinds of text: a fit is scored on a family none of its training sets belongs to (leave one family out). The
# formal family's sets, `regulations` and the others written over its knowledge base, are
# tools/eval/regulations_devset's (their questions are not in a DevSet file).
FAMILIES: dict[str, tuple[str, ...]] = {"encyclopedic": ("xquad_zh", "cmrc_trial", "cmrc_dev_news"),
                                        "web": ("dureader_dev", "dureader_train"),
                                        "formal": ("regulations", "regulations_dev2", "regulations_holdout",
                                                   "regulations_holdout2")}


def family_of(name: str) -> str:
    """A set's family; any other name (a set of no family, the off-topic questions) is a family of its own."""
    return next((f for f, names in FAMILIES.items() if name in names), name)


def load_corpus(ds: DevSet, data: Path | None = None) -> Corpus:
    """The set's documents and questions (whole set, no limit): what its cached knowledge base holds."""
    data = data or shared_data_dir()
    if ds.kind == "folder":  # its questions live elsewhere (e.g. tools/eval/regulations_devset.py)
        return Corpus(load_folder(data / ds.path), [])
    if ds.kind == "dureader":
        corpus = load_dureader(data / ds.path, None)
    else:
        corpus = load_squad(data / ds.path, None)
    if ds.distractors:
        add_distractors(corpus, data / ds.distractors, None)
    return corpus


def load_folder(folder: Path) -> dict[str, str]:
    """file name → text of every Markdown document of a folder (its README.md describes it, is not one)."""
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.md")) if p.name != "README.md"}


# ------------------------------------------------------------------------------------------------ gold matching
def gold_ids(q: Question, key_to_doc: dict[str, int]) -> set[int]:
    """The doc_ids of the question's gold documents in a knowledge base built from its corpus."""
    return {key_to_doc[k] for k in q.gold_docs if k in key_to_doc}


def is_hit(node, q: Question, gold: set[int]) -> bool:
    """A retrieved chunk (NodeWithScore) is a hit: it belongs to a gold document and (SQuAD) holds an answer."""
    if node.node.metadata.get("doc_id") not in gold:
        return False
    return q.held_by(node.node.get_content())


ANSWER_OVERLAP = 12


def dureader_spans(path: Path) -> dict[str, list[str]]:
    """question → its gold answer spans (DuReader's fake_answers: spans of the most related paragraph)."""
    out: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            out[d["question"]] = [a for a in d.get("fake_answers") or [] if a.strip()]
    return out


_EDGE = " \t\n。！？；，、：.!?;,:"


def holds_answer(text: str, answers: list[str], spans: list[str]) -> bool:
    """Does this answer sentence hold a gold answer? It contains one (CMRC trial's answers are whole sentences
    with their full stop, so edge punctuation is ignored), or — for gold answers longer than a sentence — it is
    one of the gold answer's sentences (≥ 8 characters of it); DuReader: it shares ≥ ANSWER_OVERLAP characters in
    a row with a gold answer span, or lies inside one."""
    for a in answers:
        a = a.strip(_EDGE)
        if a and (a in text or (len(a) > len(text) >= 8 and text.strip(_EDGE) in a)):
            return True
    for s in spans:
        if text in s and len(text) >= 6:
            return True
        if any(text[i:i + ANSWER_OVERLAP] in s for i in range(0, max(len(text) - ANSWER_OVERLAP + 1, 0))):
            return True
    return False
