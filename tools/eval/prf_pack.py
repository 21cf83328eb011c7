"""Study packs for the vocabulary-gap study (tools/eval/prf_study.py): one file per dev set holding what a
query-expansion variant needs to be re-scored without an engine — every chunk's stored BM25 tokens, text, document
and stored vector, every question's query vector and gold — read from a copy of the cached knowledge base.

    python -m tools.eval.prf_pack --kb-cache /work/cache/kb --out DIR [--terms] [NAME ...]

With --terms also each KB's vocabulary (Chinese terms of ≥ 2 characters in ≥ 2 chunks) and the questions' other
content words, embedded once as queries (`NAME.terms.pkl`: the vocabulary-neighbour variants of prf_study).

The cached KB is copied (its app.db and chroma/) to a temp dir and read there; the cache is never written. Query
vectors come from the packaged embedding model, as the engine embeds a question.
"""
from __future__ import annotations

import argparse
import pickle
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from store.documents import decode_tokens
from tools.eval.devsets import DEV_SETS, gold_ids
from tools.eval.evaluate import named_set
from tools.eval.regulations_devset import OTHER_SETS, REGULATIONS

REPO = Path(__file__).resolve().parents[2]
SETS = [*DEV_SETS, REGULATIONS.name, *OTHER_SETS]


def read_chunks(db: Path) -> dict:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = con.execute("SELECT c.chunk_id, c.doc_id, c.chunk_index, c.text, c.tokens FROM kb_chunk c "
                       "JOIN kb_document d ON d.doc_id = c.doc_id WHERE d.status = 'ready' AND c.enabled = 1 "
                       "ORDER BY c.chunk_id").fetchall()
    con.close()
    return {"ids": np.array([r[0] for r in rows], dtype=np.int64), "doc": np.array([r[1] for r in rows]),
            "index": np.array([r[2] for r in rows]), "text": [r[3] for r in rows],
            "tokens": [decode_tokens(r[4]) for r in rows]}


def read_vectors(chroma_dir: Path, ids: np.ndarray) -> np.ndarray:
    import chromadb

    from store.vectors import COLLECTION

    client = chromadb.PersistentClient(path=str(chroma_dir))
    col = client.get_collection(COLLECTION)
    out = np.zeros((len(ids), 0), dtype=np.float32)
    at = {int(c): i for i, c in enumerate(ids)}
    step = 2000
    for s in range(0, len(ids), step):
        got = col.get(ids=[str(int(c)) for c in ids[s:s + step]], include=["embeddings"])
        m = np.asarray(got["embeddings"], dtype=np.float32)
        if out.shape[1] == 0:
            out = np.zeros((len(ids), m.shape[1]), dtype=np.float32)
        for cid, v in zip(got["ids"], m):
            out[at[int(cid)]] = v
    return out / (np.linalg.norm(out, axis=1, keepdims=True) + 1e-12)


def pack(root: Path, name: str, out: Path, embed) -> None:
    ds, corpus = named_set(name)
    cached = root / ds.name
    with tempfile.TemporaryDirectory(prefix="kbqa-prf-") as tmp:
        t0 = time.perf_counter()
        subprocess.run(["cp", "-a", str(cached / "chroma"), str(Path(tmp) / "chroma")], check=True)
        chunks = read_chunks(cached / "app.db")
        chunks["vec"] = read_vectors(Path(tmp) / "chroma", chunks["ids"])
    import json
    key_to_doc = json.loads((cached / "key_to_doc.json").read_text(encoding="utf-8"))
    t1 = time.perf_counter()
    qs = []
    for q in corpus.questions:
        qs.append({"q": q.text, "gold": sorted(gold_ids(q, key_to_doc)), "answers": q.answers,
                   "ws_free": q.whitespace_free,
                   "vec": np.asarray(embed.get_query_embedding(q.text), dtype=np.float32)})
    print(f"# {name}: {len(chunks['ids'])} chunks read in {t1 - t0:.0f} s, {len(qs)} questions embedded in "
          f"{time.perf_counter() - t1:.0f} s", file=sys.stderr)
    with open(out / f"{name}.pkl", "wb") as fh:
        pickle.dump({"name": name, "chunks": chunks, "questions": qs}, fh, protocol=5)


_CJK = re.compile(r"[\u4e00-\u9fff]")


def vocabulary(tokens: list[list[str]], min_df: int = 2) -> list[str]:
    """The knowledge base's terms worth a neighbour: Chinese words of ≥ 2 characters in ≥ `min_df` chunks, not
    function words (what a question's word may be expanded to)."""
    from tools.eval.prf_study import expandable

    df = Counter()
    for t in tokens:
        df.update(set(t))
    return sorted(t for t, c in df.items() if c >= min_df and len(t) >= 2 and _CJK.search(t) and expandable(t))


def embed_terms(embed, terms: list[str]) -> np.ndarray:
    """Each term embedded as a query (the same side as the question's words), unit length."""
    out = np.zeros((len(terms), 0), dtype=np.float32)
    for s in range(0, len(terms), 256):
        m = np.asarray([embed.get_query_embedding(t) for t in terms[s:s + 256]], dtype=np.float32)
        out = m if s == 0 else np.vstack([out, m])
    return out / (np.linalg.norm(out, axis=1, keepdims=True) + 1e-12)


def pack_terms(packs: Path, name: str, embed, tok) -> None:
    """The set's vocabulary and its question words, embedded once (`<name>.terms.pkl`)."""
    from pipeline.retrieval.lexical import content_terms

    with open(packs / f"{name}.pkl", "rb") as fh:
        p = pickle.load(fh)
    t0 = time.perf_counter()
    vocab = vocabulary(p["chunks"]["tokens"])
    qterms = sorted({t for q in p["questions"] for t in content_terms(tok(q["q"]))} - set(vocab))
    vv = embed_terms(embed, vocab)
    qv = embed_terms(embed, qterms) if qterms else np.zeros((0, vv.shape[1]), dtype=np.float32)
    print(f"# {name}: {len(vocab)} vocabulary terms, {len(qterms)} other question words embedded in "
          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    with open(packs / f"{name}.terms.pkl", "wb") as fh:
        pickle.dump({"vocab": vocab, "vocab_vec": vv, "qterms": qterms, "qterm_vec": qv}, fh, protocol=5)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.eval.prf_pack", description=__doc__)
    ap.add_argument("--kb-cache", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--terms", action="store_true", help="embed each set's vocabulary and question words")
    ap.add_argument("names", nargs="*", default=SETS)
    args = ap.parse_args(argv)
    from pipeline.models.embeddings import load_embedding

    embed = load_embedding("", REPO, REPO / "models").embed_model
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        if not (out / f"{name}.pkl").exists():
            pack(Path(args.kb_cache), name, out, embed)
        if args.terms and not (out / f"{name}.terms.pkl").exists():
            from pipeline.models.tokenize_zh import ChineseTokenizer

            pack_terms(out, name, embed, ChineseTokenizer())
    return 0


if __name__ == "__main__":
    sys.exit(main())
