"""The extractive answer of every dev question with what the subject check reads, dumped for offline fitting.

    python -m tools.eval.subject_dataset --kb-cache /work/cache/kb --out DIR [--per-set 300] [NAME ...]

For each knowledge base (the dev sets of tools/eval/devsets.DEV_SETS and `regulations`) writes DIR/<name>.jsonl,
one line per question, through the app's own stages (retrieval + gate, then the extractive picker on the final
sources, as `ask_sync` runs them offline):
  kind = "answerable"    the set's questions (regulations: its answerable list) with `hit` (the answer holds the
                         gold: tools/eval/answer_eval's rule, regulations: formal_metrics.answer_hit);
         "unanswerable"  regulations only: same-domain questions whose rule lives in a law not in the KB;
         "gold_removed"  SQuAD / DuReader questions with the gold removed from both routes (tools/eval/gate_dataset's
                         removal) — same-domain questions the KB cannot answer, the other families' counterpart;
         "off_topic"     regulations only: tests/data/offtopic_everyday.txt.
Each row holds the gate outcome and score, whether the picker found an answer (its score and the KB background's
median), the question's tokens / segments and the KB's document frequency of each, the text of every final source
with the numbers the answer cites, the quoted sentences, whether they offer the kind of answer asked
(pipeline/generation/answer_type.py) and each content word's e5 cosine with the best of them — what a check of the
question's subject against the answer's passages can read (tools/eval/subject_scan.py scores its variants in
seconds). Such a check only turns an answer weak or refused: replaying it on the dump is exact. The dump is also
the three families' answer path in one place (gate outcome, score, sources, picked sentences) for any other
leave-one-family-out study of the offline answer.
"""
from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

from pipeline.generation.answer_type import expected_kind, holds_verdict, offers
from pipeline.generation.extractive import render
from pipeline.models.vectors import unit
from pipeline.retrieval.gate import decide
from pipeline.retrieval.lexical import content_terms
from tools.eval.answer_eval import open_for_eval
from tools.eval.cli import add_kb_cache, command_parser, kb_cache_root
from tools.eval.devsets import DEV_SETS, dureader_spans, holds_answer, load_corpus, shared_data_dir
from tools.eval.formal_eval import OFF_TOPIC, load_lines
from tools.eval.formal_metrics import answer_hit, answer_lines
from tools.eval.gate_dataset import DEEP_RECALL, _remover
from tools.eval.regulations_devset import REGULATIONS, load_items

SEED = 13  # the answerable sample is answer_eval's (--limit N draws with the same seed)
FAMILY = {"xquad_zh": "encyclopedic", "cmrc_trial": "encyclopedic", "cmrc_dev_news": "encyclopedic",
          "dureader_dev": "web", "dureader_train": "web", "regulations": "formal"}


def _retrieve(engine, question: str, exclude=None):
    """RetrievalService.retrieve, with `exclude` dropping results before the fusion (gold removal)."""
    rs, s = engine.components.retrieval, engine.settings
    if exclude is None:
        return rs.retrieve(question, s)
    t0 = time.perf_counter()
    bundle, fusion, embed_ms = rs.recall(question, s, recall=DEEP_RECALL, keep=lambda n: not exclude(n))
    res = rs._result(question, s, bundle, fusion, embed_ms, t0, None)
    scope = rs.scope(None)
    bg = rs.background(scope) if s.adaptive_gate else None
    d = decide(rs.gate_features(question, fusion, scope), bg, s.min_similarity, bool(fusion.fused),
               model=rs.gate_model, adaptive=s.adaptive_gate, sentence=lambda: rs.best_sentence(bundle.embedding, fusion))
    res.gate, res.hit = d.trace(), d.hit
    return rs.rerank_stage(res, s)


def row(engine, question: str, exclude=None) -> dict:
    c = engine.components
    res = _retrieve(engine, question, exclude)
    tok = c.tokenizer
    tokens, segments = tok(question), tok.segments(question)
    weights = c.retrieval.term_weights()
    out = {"q": question, "tokens": tokens, "segments": segments, "n_docs": weights.n,
           "df": {w: weights.df_of(w) for w in dict.fromkeys(tokens + segments)},
           "gate": res.gate.get("outcome") if res.gate else ("answer" if res.hit else "refuse"),
           "gate_score": res.gate.get("score") if res.gate else None}
    if not res.hit:
        return out | {"found": False, "answer": "", "sources": [], "cited": [], "picked": []}
    pick = c.picker.pick(question, res.final, res.query_embedding)
    deltas, cited = render(pick)
    bg = c.gate_background.current(None)
    kind = expected_kind(question)
    texts = [p.piece.text for p in pick.sentences]
    return out | {"found": pick.found, "answer": "".join(deltas), "cited": sorted(cited),
                  "picked": [[p.source, p.piece.text] for p in pick.sentences],
                  "pick_score": pick.score, "bg_median": bg.sim_median if bg else None,
                  "picked_cos": [p.cosine for p in pick.sentences], "asked": kind,
                  "offers": [offers(kind, t, question, tok.tagged) or holds_verdict(kind, t, question) for t in texts],
                  "term_cos": _term_cos(c.retrieval.embed_model, content_terms(tokens), texts),
                  "sources": [{"text": n.node.get_content(), "doc_id": n.node.metadata.get("doc_id")}
                              for n in res.final]}


def _term_cos(embed_model, terms: list[str], texts: list[str]) -> dict[str, float]:
    """Each content term (as an e5 query) against the best of the answer's sentences (as passages)."""
    if not terms or not texts:
        return {}
    sent = unit(embed_model.get_text_embedding_batch(texts))
    return {t: round(float(max(sent @ unit(embed_model.get_query_embedding(t)))), 4) for t in terms}


def dump_devset(name: str, engine, key_to_doc, per_set: int, write) -> None:
    ds = DEV_SETS[name]
    qs = [q for q in load_corpus(ds).questions if q.text.strip()]
    spans = dureader_spans(shared_data_dir() / ds.path) if ds.kind == "dureader" else {}
    sample = random.Random(SEED).sample(qs, min(per_set, len(qs)))
    for q in sample:
        r = row(engine, q.text)
        sp = spans.get(q.text, [])
        lines = answer_lines(r["answer"]) if r["found"] else []
        write(r | {"kind": "answerable", "hit": any(holds_answer(ln, q.answers, sp) for ln in lines)})
    for q in random.Random(SEED + 1).sample(qs, min(per_set // 2, len(qs))):
        write(row(engine, q.text, _remover(q, key_to_doc)) | {"kind": "gold_removed"})


def dump_regulations(engine, write) -> None:
    items = load_items()
    for a in items.answerable:
        r = row(engine, a.question)
        write(r | {"kind": "answerable", "id": a.id, "type": a.type,
                   "hit": bool(r["sources"]) and answer_hit(r["answer"], a.gold.span)})
    for u in items.unanswerable:
        write(row(engine, u.question) | {"kind": "unanswerable", "id": u.id})
    for i, q in enumerate(load_lines(OFF_TOPIC), 1):
        write(row(engine, q) | {"kind": "off_topic", "id": f"o{i:03d}"})


def main(argv=None) -> int:
    ap = command_parser("tools.eval.subject_dataset", __doc__)
    add_kb_cache(ap)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--per-set", type=int, default=300, help="answerable questions sampled per dev set")
    ap.add_argument("names", nargs="*", default=["regulations", "xquad_zh", "cmrc_trial", "dureader_dev",
                                                  "cmrc_dev_news"])
    args = ap.parse_args(argv)
    root = kb_cache_root(ap, args)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        t0, n = time.perf_counter(), 0
        ds = REGULATIONS if name == "regulations" else DEV_SETS[name]
        with tempfile.TemporaryDirectory(prefix="kbqa-subj-") as tmp, \
                open(args.out / f"{name}.jsonl.tmp", "w", encoding="utf-8") as f:
            engine, key_to_doc = open_for_eval(root, ds, Path(tmp) / name)

            def write(r: dict, name: str = name, f=f) -> None:
                nonlocal n
                n += 1
                r["terms"] = content_terms(r["tokens"])
                f.write(json.dumps({"set": name, "family": FAMILY[name]} | r, ensure_ascii=False) + "\n")

            try:
                if name == "regulations":
                    dump_regulations(engine, write)
                else:
                    dump_devset(name, engine, key_to_doc, args.per_set, write)
            finally:
                engine.close()
        (args.out / f"{name}.jsonl.tmp").rename(args.out / f"{name}.jsonl")
        print(f"{name}: {n} rows ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
