"""Sentence vectors of the candidate chunks of a fusion dump, cached on disk (for the second-stage study).

    python -m tools.sentence_cache --kb-cache DIR --dump-dir DIR --out DIR [--sets a,b]

For every dev set: every chunk that appears among a dump's candidates is split into sentences
(pipeline.generation.sentences.split_sentences, the splitter the extractive picker uses) and each sentence is
embedded with the packaged e5 as a passage; every question is embedded as a query (the engine's prefixes).
Written to <out>/<set>.npz: chunk_ids, starts (chunk i's sentences are rows starts[i]:starts[i+1]), sent
(float16 vectors), chars (sentence lengths), and queries (float32, in dump row order). Read-only on the KB
cache (SQLite opened with mode=ro). Embedding runs once (minutes); tools.fusion_stage2 re-scores in seconds.
"""
from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
from pathlib import Path

import numpy as np

from pipeline.models.e5_convert import PASSAGE_PREFIX, QUERY_PREFIX
from pipeline.retrieval.sentence_evidence import chunk_sentences  # the gate's own split: one definition

REPO = Path(__file__).resolve().parents[1]


def dump_chunk_ids(dump: Path) -> tuple[list[int], list[str]]:
    ids: set[int] = set()
    questions = []
    with open(dump, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            questions.append(row["q"])
            ids.update(int(c[0]) for c in row["cands"])
    return sorted(ids), questions


def build(kb_dir: Path, dump: Path, out: Path, embed) -> dict:
    ids, questions = dump_chunk_ids(dump)
    con = sqlite3.connect(f"file:{kb_dir / 'app.db'}?mode=ro", uri=True)
    text = {}
    for lo in range(0, len(ids), 500):
        part = ids[lo:lo + 500]
        rows = con.execute(f"SELECT chunk_id, text FROM kb_chunk WHERE chunk_id IN ({','.join('?' * len(part))})",
                           part).fetchall()
        text.update(rows)
    con.close()
    sents, starts = [], [0]
    for cid in ids:
        sents.extend(chunk_sentences(text.get(cid, "")))
        starts.append(len(sents))
    t0 = time.perf_counter()
    vec = embed([PASSAGE_PREFIX + s for s in sents])
    qv = embed([QUERY_PREFIX + q for q in questions])
    secs = time.perf_counter() - t0
    np.savez(out, chunk_ids=np.array(ids, dtype=np.int64), starts=np.array(starts, dtype=np.int64),
             sent=vec.astype(np.float16), chars=np.array([len(s) for s in sents], dtype=np.int32),
             queries=qv.astype(np.float32))
    return {"chunks": len(ids), "sentences": len(sents), "questions": len(questions), "embed_s": round(secs, 1)}


def main(argv=None) -> int:
    from pipeline.models.embeddings import load_embedding
    from tools.kb_cache import DEV_SETS

    ap = argparse.ArgumentParser(prog="python -m tools.sentence_cache", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb-cache", required=True)
    ap.add_argument("--dump-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sets", default=None)
    args = ap.parse_args(argv)
    emb = load_embedding("", REPO, REPO / "models")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in (args.sets.split(",") if args.sets else list(DEV_SETS)):
        target = out / f"{name}.npz"
        if target.exists():
            continue
        tmp = out / f"{name}.tmp.npz"
        info = build(Path(args.kb_cache) / name, Path(args.dump_dir) / f"{name}.jsonl", tmp,
                     emb.embed_model.embed_raw)
        tmp.rename(target)
        print(name, info, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
