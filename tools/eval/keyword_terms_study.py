"""Which terms the keyword route should index and ask with: jieba's search-mode words (today), character bigrams,
or both — measured on the keyword route alone, per set and family, over the cached dev-set knowledge bases.

    python -m tools.eval.keyword_terms_study --kb-cache DIR [--sets …] [--json OUT]

Every scheme indexes each chunk's context line + text (pipeline.ingestion.structured_chunking.indexed_text) and
scores with Lucene BM25 (k1 1.5, b 0.75, the app's defaults) over the whole knowledge base; nothing is fitted:

- `words`: the stored tokens (pipeline/models/tokenize_zh.py: jieba search mode), the question tokenized alike;
- `bigrams`: the character bigrams of every run of Chinese characters, nothing else;
- `both`: words, then bigrams, in one vocabulary — a bigram that is also a word is the same term, so a two-character
  word the question shares counts twice;
- `both_apart`: words and bigrams as separate terms (a bigram prefixed), so the words' statistics stay as today;
- `ask_bigrams`: the index keeps the words; the question adds its bigrams (only those that are words of the index
  can match) — no re-indexing;
- `ask_unseen`: as `ask_bigrams`, but only the bigrams of question words the index lacks.

A question's gold is the dev set's (tools/eval/devsets.is_hit: a chunk of a gold document holding an answer; the
formal sets: a chunk holding the deciding span). Results and the end-to-end runs: docs/retrieval-eval.md, "Character
bigrams in the keyword route".
"""
from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import bm25s

from pipeline.ingestion.structured_chunking import indexed_text
from pipeline.models.tokenize_zh import ChineseTokenizer
from store.documents import decode_tokens
from tools.eval.devsets import family_of, gold_ids
from tools.eval.kb_cache import cache_root
from tools.eval.regulations_devset import OTHER_SETS

SCHEMES = ("words", "bigrams", "both", "both_apart", "ask_bigrams", "ask_unseen")
DEFAULT_SETS = ("xquad_zh", "cmrc_trial", "cmrc_dev_news", "dureader_dev", "dureader_train", "regulations",
                *OTHER_SETS)
DEPTH = 50
_HAN_RUN = re.compile(r"[\u4e00-\u9fff]{2,}")
APART = "#"  # no token of ChineseTokenizer starts with it (punctuation is cut off)


def bigrams(text: str) -> list[str]:
    """Character bigrams of every run of two or more Chinese characters (NFKC, as the tokenizer reads text), in
    text order."""
    return [run[i:i + 2] for run in _HAN_RUN.findall(unicodedata.normalize("NFKC", text)) for i in range(len(run) - 1)]


def apart_terms(words: list[str], text: str) -> list[str]:
    """`both_apart`'s terms of a text whose words are given: the words, then its bigrams as terms of their own."""
    return words + [APART + g for g in bigrams(text)]


@dataclass
class Chunk:
    doc_id: int
    text: str          # what a hit is judged on
    indexed: str       # context line + text: what is tokenized
    words: list[str]   # the stored tokens


ASK_ONLY = ("ask_bigrams", "ask_unseen")  # schemes that index the words, as `words` does


def index_terms(scheme: str, chunk: Chunk) -> list[str]:
    if scheme == "words" or scheme in ASK_ONLY:
        return chunk.words
    grams = bigrams(chunk.indexed)
    if scheme == "bigrams":
        return grams
    if scheme == "both":
        return chunk.words + grams
    return apart_terms(chunk.words, chunk.indexed)


def query_terms(scheme: str, words: list[str], question: str, vocab: Callable[[str], bool]) -> list[str]:
    grams = bigrams(question)
    if scheme == "words":
        return words
    if scheme == "bigrams":
        return grams
    if scheme == "both" or scheme == "ask_bigrams":
        return words + grams
    if scheme == "both_apart":
        return apart_terms(words, question)
    return words + [g for w in words if not vocab(w) for g in bigrams(w)]  # ask_unseen


def build_index(chunks: Sequence[Chunk], scheme: str) -> bm25s.BM25:
    index = bm25s.BM25(k1=1.5, b=0.75)
    index.index([index_terms(scheme, c) for c in chunks], show_progress=False)
    return index


def ranks(chunks: Sequence[Chunk], questions: Sequence, is_gold: Callable[[object, Chunk], bool], scheme: str,
          tokenize: Callable[[str], list[str]], index: bm25s.BM25 | None = None) -> list[int | None]:
    """Per question, the 1-based rank of its first gold chunk among the keyword route's top DEPTH (None: deeper).
    `index`: the scheme's index of `chunks` when built already (build_index)."""
    index = index if index is not None else build_index(chunks, scheme)
    vocab = index.vocab_dict
    out: list[int | None] = []
    for q in questions:
        terms = [t for t in query_terms(scheme, tokenize(q.text), q.text, vocab.__contains__) if t in vocab]
        rank = None
        if terms:
            found, _ = index.retrieve([terms], k=min(DEPTH, len(chunks)), show_progress=False)
            rank = next((i + 1 for i, j in enumerate(found[0]) if is_gold(q, chunks[j])), None)
        out.append(rank)
    return out


def metrics(rs: Sequence[int | None]) -> dict:
    n = max(len(rs), 1)
    return {"mrr@10": round(sum(1 / r for r in rs if r and r <= 10) / n, 4),
            "hit@1": round(sum(r == 1 for r in rs) / n, 4),
            "recall@50": round(sum(r is not None for r in rs) / n, 4), "n": len(rs)}


def load_chunks(data_dir: Path) -> list[Chunk]:
    """The ready, enabled chunks of a cached knowledge base (its app.db, opened read-only)."""
    db = sqlite3.connect(f"file:{data_dir / 'app.db'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT c.doc_id, c.text, c.context, c.tokens FROM kb_chunk c JOIN kb_document d "
                          "USING (doc_id) WHERE c.enabled = 1 AND d.active = 1 AND d.status = 'ready' "
                          "ORDER BY c.chunk_id").fetchall()
    finally:
        db.close()
    return [Chunk(d, t, indexed_text(t, c), decode_tokens(tok)) for d, t, c, tok in rows]


def study_set(name: str, cache: Path, tokenize: Callable[[str], list[str]]) -> dict:
    from tools.eval.evaluate import named_set  # the engine's imports: only when a set is studied

    ds, corpus = named_set(name)
    data_dir = cache / ds.name
    key_to_doc = json.loads((data_dir / "key_to_doc.json").read_text(encoding="utf-8"))
    chunks = load_chunks(data_dir)
    gold = {id(q): gold_ids(q, key_to_doc) for q in corpus.questions}

    def is_gold(q, c: Chunk) -> bool:
        return c.doc_id in gold[id(q)] and q.held_by(c.text)

    words = build_index(chunks, "words")  # what `words` and the ask_* schemes search: built once

    def scored(s: str) -> dict:
        index = words if s == "words" or s in ASK_ONLY else None
        return metrics(ranks(chunks, corpus.questions, is_gold, s, tokenize, index))

    return {"set": name, "family": family_of(name), "chunks": len(chunks), "schemes": {s: scored(s) for s in SCHEMES}}


def print_table(rows: list[dict]) -> None:
    print("| family | set | " + " | ".join(SCHEMES) + " |")
    print("|---|---|" + "---|" * len(SCHEMES))
    for r in rows:
        cells = [f"{m['mrr@10']:.4f} / {m['hit@1']:.4f}" for m in r["schemes"].values()]
        print(f"| {r['family']} | {r['set']} ({r['schemes']['words']['n']} q) | " + " | ".join(cells) + " |")
    print("(MRR@10 / Hit@1 of the keyword route alone)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.eval.keyword_terms_study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kb-cache", default=None, help="cache dir of built dev-set KBs (or $KBQA_KB_CACHE)")
    p.add_argument("--sets", default=",".join(DEFAULT_SETS), help="comma-separated set names")
    p.add_argument("--json", default=None, help="write the rows as JSON")
    args = p.parse_args(argv)
    cache = cache_root(args.kb_cache)
    if cache is None:
        p.error("--kb-cache (or $KBQA_KB_CACHE) is required: the study reads built knowledge bases")
    tok = ChineseTokenizer()
    rows = [study_set(n, cache, tok.tokenize) for n in args.sets.split(",") if n]
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
