"""Per-question gate features on the dev-set knowledge bases, dumped for offline calibration (seconds to refit).

    python -m tools.eval.gate_dataset --kb-cache /work/cache/kb --out /work/cache/gate [--per-set 800] [NAME ...]

For each dev-set knowledge base (tools/eval/kb_cache.py) writes OUT/<name>.jsonl, one line per question:
  kind = "answerable"   its own questions (hit1 / hit6: the fused top-1 / top-6 holds the gold);
         "gold_removed" its own questions with the gold removed from the results (SQuAD: the gold passage and
                        every chunk containing an answer; DuReader: every paragraph of the question's own search
                        results) — unanswerable questions about the same documents;
         "out_of_kb"    questions of the other dev sets (their passages are not in this knowledge base);
         "probe"        the background probes (pipeline/retrieval/gate_probes.py), as the app measures them.
Features are pipeline.retrieval.gate_features.measure over the same retrieval the app runs, with the sentence
evidence (pipeline/retrieval/sentence_evidence.py) measured for every row.

`regulations` (the formal-documents family, tools/eval/regulations_devset.REGULATIONS; not a DEV_SETS entry) dumps
the regulations dev set: "answerable" its answerable questions (hit1 / hit6: the fused top-1 / top-6 holds the gold
span, tools/eval/formal_metrics.holds_span), "unanswerable" its same-domain unanswerable questions (the rule is in a
law the KB lacks — the real counterpart of "gold_removed"), "out_of_kb" the everyday off-topic questions
(tools/eval/formal_eval.OFF_TOPIC, qset "offtopic"). The other sets' dumps do not change (no regulations question
is added to their out-of-KB rows).
"""
from __future__ import annotations

import contextlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from llama_index.core.schema import NodeWithScore

from pipeline.retrieval.gate_probes import PROBES
from pipeline.retrieval.lexical import normalize
from tools.eval.cli import add_kb_cache, command_parser, kb_cache_root
from tools.eval.devsets import DEV_SETS, gold_ids, is_hit, load_corpus
from tools.eval.formal_eval import OFF_TOPIC, load_lines
from tools.eval.formal_metrics import holds_span
from tools.eval.kb_cache import open_copy
from tools.eval.regulations_devset import REGULATIONS, load_items

SEED = 14
SETS = [*DEV_SETS, REGULATIONS.name]
OFF_TOPIC_QSET = "offtopic"
DEEP_RECALL = 80  # recall deeper when results are removed, so the routes still hold recall_size candidates


def _measured(engine, question: str, exclude=None):
    """(gate features, FusionOutput). Gold removal drops the results before the app's own fusion
    (HybridRetriever.run's `keep`), so the negatives are fused exactly as the app fuses."""
    rs = engine.components.retrieval
    keep = (lambda n: not exclude(n)) if exclude else None
    bundle, fusion, _ = rs.recall(question, engine.settings, recall=DEEP_RECALL if exclude else None, keep=keep)
    # every row gets the sentence evidence (the app measures it only inside the quick score's open band; the
    # calibration needs it for all rows to fit the full model and to place that band)
    return rs.gate_features(question, fusion, query_embedding=bundle.embedding).to_dict(), fusion


def _with_raw(engine, question: str, exclude=None) -> tuple[dict, list[NodeWithScore], dict]:
    feats, fusion = _measured(engine, question, exclude)
    return feats, fusion.fused, _raw(engine, question, fusion)


RAW_TOP = 6


def _raw(engine, question: str, fusion) -> dict:
    """Route scores, top chunk texts and the KB's document frequency of every question token (offline features)."""
    rs = engine.components.retrieval
    tw = rs.kbs.default.bm25.view.weights()
    tok = rs.tokenizer
    words = list(dict.fromkeys(tok(question) + tok.segments(question)))
    texts: dict[str, str] = {}
    for lst in (fusion.fused, fusion.vector, fusion.bm25):
        for n in lst[:RAW_TOP]:
            texts.setdefault(n.node.node_id, normalize(n.node.get_content()))
    return {
        "n_docs": tw.n, "df": {w: tw.df_of(w) for w in words}, "tokens": tok(question), "segments": tok.segments(question),
        "fused": [n.node.node_id for n in fusion.fused[:RAW_TOP]],
        "vector": [[n.node.node_id, round(float(n.score or 0), 5)] for n in fusion.vector[:10]],
        "bm25": [[n.node.node_id, round(float(n.score or 0), 4)] for n in fusion.bm25[:10]],
        "alpha": round(float(fusion.bm25_weight), 4), "texts": texts,
    }


def _remover(q, key_to_doc):
    """exclude(node) for the gold-removed variant of question q."""
    if q.answers:  # SQuAD: the gold passage and every chunk stating an answer
        gold = gold_ids(q, key_to_doc)
        return lambda n: (n.node.metadata.get("doc_id") in gold
                          or any(a in n.node.get_content() for a in q.answers))
    # DuReader: the whole search result list the question came with ("q12d3p4" → every "q12d…")
    prefixes = {k.split("d", 1)[0] + "d" for k in q.gold_docs}
    own = {d for k, d in key_to_doc.items() if any(k.startswith(p) for p in prefixes)}
    return lambda n: n.node.metadata.get("doc_id") in own


@contextlib.contextmanager
def _dump(cache: Path, ds, out: Path):
    """An engine on a copy of `ds`'s cached KB and `write(kind, qset, text, got, **extra)` into both dump files,
    the probes first; the files take their final names when the block ends."""
    name = ds.name
    with tempfile.TemporaryDirectory(prefix="kbqa-gate-") as tmp:
        engine, key_to_doc = open_copy(cache, ds, Path(tmp) / name)
        with open(out / f"{name}.jsonl.tmp", "w", encoding="utf-8") as f, \
                open(out / f"{name}.raw.tmp", "w", encoding="utf-8") as raw:
            def write(kind, qset, text, got, **extra):
                f.write(json.dumps({"kb": name, "kind": kind, "qset": qset, "q": text, "f": got[0], **extra},
                                   ensure_ascii=False) + "\n")
                raw.write(json.dumps({"kind": kind, "q": text, **got[2]}, ensure_ascii=False) + "\n")

            for p in PROBES:
                write("probe", "probe", p, _with_raw(engine, p))
            yield engine, key_to_doc, write
        engine.close()
    (out / f"{name}.jsonl.tmp").rename(out / f"{name}.jsonl")
    (out / f"{name}.raw.tmp").rename(out / f"{name}.raw")


def dump_set(name: str, cache: Path, out: Path, per_set: int, questions_of: dict) -> None:
    rnd = random.Random(SEED)
    own = questions_of[name]
    sample = rnd.sample(own, min(per_set, len(own)))
    removed = rnd.sample(own, min(per_set // 2, len(own)))
    others = []
    for other, qs in questions_of.items():
        if other != name:
            others += [(other, q) for q in rnd.sample(qs, min(per_set // 4, len(qs)))]
    t0 = time.perf_counter()
    with _dump(cache, DEV_SETS[name], out) as (engine, key_to_doc, write):
        for q in sample:
            got = _with_raw(engine, q.text)
            gold = gold_ids(q, key_to_doc)
            write("answerable", name, q.text, got, hit1=bool(got[1]) and is_hit(got[1][0], q, gold),
                  hit6=any(is_hit(n, q, gold) for n in got[1][:6]))
        for other, q in others:
            got = _with_raw(engine, q.text)
            # an answer string of another set's question may still stand in this KB: flag it (not a clean negative)
            write("out_of_kb", other, q.text, got,
                  answer_here=any(a in n.node.get_content() for n in got[1][:6] for a in q.answers))
        for q in removed:
            write("gold_removed", name, q.text, _with_raw(engine, q.text, _remover(q, key_to_doc)))
    print(f"{name}: {len(PROBES)} probes, {len(sample)} answerable, {len(removed)} gold removed, "
          f"{len(others)} out of KB ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)


def dump_regulations(cache: Path, out: Path, per_set: int) -> None:
    """The formal family's set: its answerable questions, its same-domain unanswerable ones, the off-topic ones."""
    items = load_items()
    answerable = random.Random(SEED).sample(items.answerable, min(per_set, len(items.answerable)))
    offtopic = load_lines(OFF_TOPIC)
    name = REGULATIONS.name
    t0 = time.perf_counter()
    with _dump(cache, REGULATIONS, out) as (engine, _, write):
        for a in answerable:
            got = _with_raw(engine, a.question)
            span = a.gold.span
            write("answerable", name, a.question, got,
                  hit1=bool(got[1]) and holds_span(got[1][0].node.get_content(), span),
                  hit6=any(holds_span(n.node.get_content(), span) for n in got[1][:6]))
        for q in offtopic:
            write("out_of_kb", OFF_TOPIC_QSET, q, _with_raw(engine, q), answer_here=False)
        for u in items.unanswerable:
            write("unanswerable", name, u.question, _with_raw(engine, u.question))
    print(f"{name}: {len(PROBES)} probes, {len(answerable)} answerable, {len(items.unanswerable)} unanswerable, "
          f"{len(offtopic)} off-topic ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)


def main(argv=None) -> int:
    ap = command_parser("tools.eval.gate_dataset", __doc__)
    add_kb_cache(ap)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--per-set", type=int, default=800, help="answerable questions sampled per set")
    ap.add_argument("names", nargs="*", default=list(DEV_SETS), help=f"default: the DEV_SETS; known: {', '.join(SETS)}")
    args = ap.parse_args(argv)
    for name in args.names:
        if name not in SETS:
            ap.error(f"unknown set {name}; known: {', '.join(SETS)}")
    root = kb_cache_root(ap, args)
    args.out.mkdir(parents=True, exist_ok=True)
    questions_of = {n: load_corpus(DEV_SETS[n]).questions for n in DEV_SETS}
    for name in args.names:
        if name == REGULATIONS.name:
            dump_regulations(root, args.out, args.per_set)
        else:
            dump_set(name, root, args.out, args.per_set, questions_of)
    return 0


if __name__ == "__main__":
    sys.exit(main())
