"""Per-question material of the extractive picker on the dev-set KBs, dumped for offline calibration: every
statement of the top sources with its lexical evidence and its cosine, so picker variants are refitted in
seconds without re-embedding (tools/eval/calibrate_extractive.py).

    python -m tools.eval.extractive_dataset --kb-cache /work/cache/kb --out DIR [--per-set 240] [--emb-cache DIR] [NAME ...]

OUT/<name>.jsonl, one line per question; kind "answerable" (its own questions) or "gold_removed" (the same
questions with every chunk that holds the answer dropped from a deeper recall's fused list, as
tools/eval/gate_dataset.py removes them — unanswerable questions about the same documents):
  q, terms, weights, grams, focus   the question's cues (pipeline.generation.candidates.Cues)
  chunks                per top source of the app's fusion, its sentences in order: text, punct, statement,
                        here (indices of the terms it contains), phrase, focus (candidates.measure), has_answer
                        (holds_answer) and, for statements, cos (the app's ≤ 96-char window embedding)
  top1                  the first source holds a gold answer (the ceiling of answer-hit); bg_median (the KB
                        background's median cosine, pipeline/retrieval/gate_background.py)
has_answer: tools/eval/devsets.holds_answer (the sentence contains a gold answer string, or is a sentence of a
longer one; DuReader: it shares ≥ ANSWER_OVERLAP characters in a row with a gold answer span, or lies inside
one). Window embeddings are cached in --emb-cache (<name>.npz) so a rerun costs seconds.

`regulations` (the formal-documents family, tools/eval/regulations_devset.REGULATIONS; not a DEV_SETS entry) dumps the
regulations dev set instead: its answerable questions (kind "answerable", gold = the deciding span) and its
same-domain unanswerable ones (kind "unanswerable": the rule is in a law the KB lacks — the real counterpart of
"gold_removed"), judged by formal_eval's own rules (tools/eval/formal_metrics): a sentence holds the answer when it
holds a contiguous run of ≥ ANSWER_SHARE of the span's content characters (formal answer-hit), top1 when the first
source holds the whole span (span in sources).
"""
from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeline.generation.candidates import Cues, measure
from pipeline.generation.extractive import ExtractivePicker
from pipeline.generation.sentences import answer_units
from pipeline.retrieval.nodes import kb_ids_of, node_text
from tools.eval.cli import add_kb_cache, command_parser, kb_cache_root
from tools.eval.devsets import DEV_SETS, dureader_spans, holds_answer, load_corpus, shared_data_dir
from tools.eval.formal_metrics import ANSWER_SHARE, holds_span, span_share
from tools.eval.gate_dataset import DEEP_RECALL, SEED, _remover
from tools.eval.kb_cache import open_copy
from tools.eval.regulations_devset import REGULATIONS, load_items

SETS = [*DEV_SETS, REGULATIONS.name]


def formal_sentence_holds(text: str, answers: list[str], spans: list[str]) -> bool:
    """A sentence holds a regulations gold span as formal_eval's answer-hit counts it (≥ ANSWER_SHARE of its
    content characters in one run)."""
    return any(span_share(text, a) >= ANSWER_SHARE for a in answers)


def formal_chunk_holds(text: str, answers: list[str], spans: list[str]) -> bool:
    """A source holds a regulations gold span as formal_eval's "span in sources" counts it (whitespace-free)."""
    return any(holds_span(text, a) for a in answers)


class EmbCache:
    """passage-window text → unit vector, persisted as <dir>/<name>.npz."""

    def __init__(self, path: Path | None, embed):
        self.path, self.embed = path, embed
        self.vecs: dict[str, np.ndarray] = {}
        if path is not None and path.exists():
            z = np.load(path, allow_pickle=False)
            self.vecs = dict(zip(z["keys"].tolist(), z["vecs"]))

    def get(self, texts: list[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self.vecs))
        for i in range(0, len(missing), 32):
            part = missing[i:i + 32]
            v = np.asarray(self.embed(part), dtype=np.float32)
            v /= np.linalg.norm(v, axis=1, keepdims=True) + 1e-9
            self.vecs.update(zip(part, v))
        return np.stack([self.vecs[t] for t in texts]) if texts else np.zeros((0, 1), np.float32)

    def save(self) -> None:
        if self.path is not None and self.vecs:
            keys = list(self.vecs)
            np.savez(self.path, keys=np.array(keys), vecs=np.stack([self.vecs[k] for k in keys]))


def question_row(picker, cache: EmbCache, q_text: str, q_emb, nodes, answers, spans,
                 holds=holds_answer, holds_chunk=holds_answer) -> dict:
    cues = Cues.of(q_text, picker.tokenizer, picker.weights_of(kb_ids_of(nodes)))
    chunks, windows, where = [], [], []
    for ci, nws in enumerate(nodes):
        sents = []
        for piece in answer_units(node_text(nws)):  # the units the picker chooses from
            ev = measure(piece, cues)
            sents.append({"text": piece.text, "punct": piece.punct, "statement": ev.statement,
                          "here": sorted(ev.here), "phrase": round(ev.phrase, 4), "focus": ev.focus,
                          "has_answer": holds(piece.text, answers, spans)})
            if ev.statement:
                windows.append(picker._window(piece.text, cues))
                where.append((ci, len(sents) - 1))
        chunks.append(sents)
    if windows:
        for (ci, si), v in zip(where, cache.get(windows) @ q_emb):
            chunks[ci][si]["cos"] = round(float(v), 5)
    return {"q": q_text, "terms": cues.terms, "weights": [round(w, 4) for w in cues.weights], "grams": cues.grams,
            "focus": cues.focus, "visible": round(cues.visible, 4), "chunks": chunks,
            "top1": bool(nodes) and holds_chunk(nodes[0].node.get_content(), answers, spans)}


def _plan(name: str, per_set: int):
    """(dev set, [(kind, [(question, answers)])], sentence test, source test) of one dumped set."""
    if name == REGULATIONS.name:
        items = load_items()
        rnd = random.Random(SEED)
        answerable = [(a.question, [a.gold.span]) for a in items.answerable]
        return (REGULATIONS, [("answerable", rnd.sample(answerable, min(per_set, len(answerable)))),
                              ("unanswerable", [(u.question, []) for u in items.unanswerable])],
                formal_sentence_holds, formal_chunk_holds)
    ds = DEV_SETS[name]
    corpus = load_corpus(ds)
    rnd = random.Random(SEED)
    sample = rnd.sample(corpus.questions, min(per_set, len(corpus.questions)))
    removed = rnd.sample(corpus.questions, min(per_set * 3 // 8, len(corpus.questions)))
    return ds, [("answerable", sample), ("gold_removed", removed)], holds_answer, holds_answer


def dump_set(name: str, root: Path, out: Path, per_set: int, emb_dir: Path | None) -> None:
    ds, plan, holds, holds_chunk = _plan(name, per_set)
    spans = dureader_spans(shared_data_dir() / ds.path) if ds.kind == "dureader" else {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kbqa-ext-") as tmp:
        engine, key_to_doc = open_copy(root, ds, Path(tmp) / name)
        s = engine.settings
        emb = engine.components.models.embedding.embed_model
        picker = ExtractivePicker(engine.components.tokenizer, emb,
                                  lambda kb_ids: engine.components.bm25.view.weights(),
                                  engine.components.picker.params)
        cache = EmbCache(emb_dir / f"{name}.npz" if emb_dir else None, emb.get_text_embedding_batch)
        bg_median = engine.components.gate_background.current().sim_median
        with open(out / f"{name}.jsonl.tmp", "w", encoding="utf-8") as f:
            for kind, questions in plan:
                for q in questions:
                    text, answers = q if isinstance(q, tuple) else (q.text, q.answers)
                    exclude = _remover(q, key_to_doc) if kind == "gold_removed" else None
                    bundle, fusion, _ = engine.components.retrieval.recall(
                        text, s, recall=DEEP_RECALL if exclude else None)
                    fused = [n for n in fusion.fused if not (exclude and exclude(n))][:s.final_top_k]
                    row = question_row(picker, cache, text, np.asarray(bundle.embedding, dtype=np.float32)
                                       / (np.linalg.norm(bundle.embedding) + 1e-9),
                                       fused[:picker.max_chunks], answers, spans.get(text, []), holds, holds_chunk)
                    f.write(json.dumps({"set": name, "kind": kind, "bg_median": bg_median,
                                        "n_sources": len(fused)} | row, ensure_ascii=False) + "\n")
        cache.save()
        engine.close()
    (out / f"{name}.jsonl.tmp").rename(out / f"{name}.jsonl")
    print(f"{name}: " + ", ".join(f"{len(qs)} {kind.replace('_', ' ')}" for kind, qs in plan)
          + f" ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)


def main(argv=None) -> int:
    ap = command_parser("tools.eval.extractive_dataset", __doc__)
    add_kb_cache(ap)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--per-set", type=int, default=240)
    ap.add_argument("--emb-cache", type=Path, default=None)
    ap.add_argument("names", nargs="*", default=list(DEV_SETS), help=f"default: the DEV_SETS; known: {', '.join(SETS)}")
    args = ap.parse_args(argv)
    for name in args.names:
        if name not in SETS:
            ap.error(f"unknown set {name}; known: {', '.join(SETS)}")
    root = kb_cache_root(ap, args)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.emb_cache:
        args.emb_cache.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        dump_set(name, root, args.out, args.per_set, args.emb_cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
