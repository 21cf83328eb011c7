"""Retrieval evaluation on public QA sets, through the real engine (ingest → BM25 / vector / fusion / rerank).

    python -m tools.eval.evaluate --squad FILE [--distractors FILE] [--dureader FILE] [--limit N]
                                  [--json OUT] [--sweep] [--dump OUT]
    python -m tools.eval.evaluate --set NAME --kb-cache DIR [--dump OUT]     (a named dev set, cached KB)
    python -m tools.eval.evaluate --cv --kb-cache DIR --dump-dir DIR [--write-weights FILE]

Builds a knowledge base in a temp data dir (or copies a cached one, tools.eval.kb_cache): each SQuAD context is one
document (optional distractor file: one document per line); with --dureader the corpus is every paragraph of
every document (JSON lines) and the gold is `most_related_para` of the documents in `answer_docs`. A hit is a
retrieved chunk that belongs to the question's gold document and (SQuAD) contains one of its answer strings.
Prints Hit@1/3/5/10, MRR@10, nDCG@10, p50/p95 latency per route: bm25, vector, union_oracle (the best
reordering of both routes' top-10), rrf (the SRS's RRF, K = 60), adaptive_rrf (the previous default) and fused
(the fusion the settings select). --dump writes every question's full-information candidates (both routes' rank
and real score for every chunk of the union, hit flags, features) for offline studies; --cv dumps each dev set
once, then fits the fusion on all sets but one and scores the left-out set, for every set (tools.eval.fusion_cv).
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from llama_index.core.schema import NodeWithScore, TextNode

from pipeline.models.paths import PACKAGED_MODEL_ID
from pipeline.retrieval.fusion import Candidates, FusionParams, fragment_length, fuse, rrf_fuse
from pipeline.retrieval.rerank import SafeRerank
from pipeline.settings import Settings
from tools.eval import fusion_cv
from tools.eval.answer_eval import answer_metrics, print_answers
from tools.eval.cli import command_parser, write_json
from tools.eval.devsets import (
    DEV_SETS,
    Corpus,
    Question,
    add_distractors,
    dureader_spans,
    gold_ids,
    is_hit,
    load_corpus,
    load_dureader,
    load_squad,
)
from tools.eval.fusion_cv import dump_length, length_field, row_features
from tools.eval.kb_cache import build_kb, cache_root, open_copy
from tools.eval.regulations_devset import OTHER_SETS, REGULATIONS, as_corpus, load_items

K = 10
SWEEP = [(1.0, 1.0), (0.75, 1.0), (0.5, 1.0), (0.35, 1.0), (0.25, 1.0), (0.0, 1.0), (1.0, 0.0)]


def metrics(ranked_hits: list[list[bool]], n_relevant: list[int], lat_ms: list[float]) -> dict:
    res = {f"hit@{k}": 0.0 for k in (1, 3, 5, 10)}
    mrr = ndcg = 0.0
    for hits, nrel in zip(ranked_hits, n_relevant):
        hits = hits[:K]
        for k in (1, 3, 5, 10):
            res[f"hit@{k}"] += any(hits[:k])
        first = next((i for i, h in enumerate(hits) if h), None)
        mrr += 1 / (first + 1) if first is not None else 0
        dcg = sum(1 / math.log2(i + 2) for i, h in enumerate(hits) if h)
        idcg = sum(1 / math.log2(i + 2) for i in range(min(max(nrel, 1), K)))
        ndcg += dcg / idcg
    n = max(len(ranked_hits), 1)
    out = {k: round(v / n, 4) for k, v in res.items()}
    out["mrr@10"] = round(mrr / n, 4)
    out["ndcg@10"] = round(ndcg / n, 4)
    out["p50_ms"] = round(float(np.percentile(lat_ms, 50)), 1) if lat_ms else None
    out["p95_ms"] = round(float(np.percentile(lat_ms, 95)), 1) if lat_ms else None
    return out


def dump_row(q: Question, n_rel: int, fusion, gold: set[int]) -> dict:
    """Full-information candidates of one question: every union chunk with both routes' rank and real score."""
    cands = []
    for n in fusion.fused:
        m = n.node.metadata
        sim = m.get("similarity")
        cands.append([n.node.node_id, m.get("bm25_rank"), m.get("vector_rank"), round(float(m["bm25_score"]), 4),
                      None if sim is None else round(float(sim), 6), is_hit(n, q, gold),
                      length_field(fragment_length(n))])
    return {"q": q.text, "n_rel": n_rel, "features": {k: round(v, 5) for k, v in fusion.features.items()},
            "cands": cands}


def candidates_from_row(row: dict):
    """A dump row back into fusion.Candidates (no model, no index), plus each candidate's hit flag."""
    c = Candidates()
    rows = row["cands"]
    c.ids = [r[0] for r in rows]
    c.nodes = [NodeWithScore(node=TextNode(id_=r[0], text=""), score=None) for r in rows]
    c.bm25_rank = [r[1] for r in rows]
    c.vector_rank = [r[2] for r in rows]
    c.bm25_score = np.array([r[3] for r in rows], dtype=np.float64)
    c.cosine = None if any(r[4] is None for r in rows) else np.array([r[4] for r in rows], dtype=np.float64)
    c.lengths = [dump_length(r) for r in rows]
    return c, {r[0]: r[5] for r in rows}


def route_hits(row: dict, key: int) -> list[bool]:
    """A single route's top-K hit flags from a dump row (key 1: BM25 rank, 2: vector rank)."""
    ranked = sorted((r for r in row["cands"] if r[key] is not None), key=lambda r: r[key])
    return [r[5] for r in ranked[:K]]


def union_oracle(row: dict) -> list[bool]:
    """The best reordering of the union of both routes' top-K: a hit at rank 1 if the union holds one."""
    top = [r for r in row["cands"] if (r[1] or K + 1) <= K or (r[2] or K + 1) <= K]
    return [any(r[5] for r in top)]


def reference_params(s, fusion_calibration):
    """The fusions every evaluation reports beside the configured one: the SRS's RRF, the adaptive RRF, and
    (convex mode with the fragment prior on) the same convex fusion without the prior — old and new, one run.
    `fusion_calibration`: the `fusion` section of the embedding model's calibration profile."""
    ad = fusion_calibration.adaptive_rrf
    refs = {"rrf": FusionParams(mode="rrf", rrf_k=60, bm25_adaptive=False),  # the SRS's RRF, K = 60
            "adaptive_rrf": FusionParams(mode="rrf", rrf_k=s.rrf_k, bm25_weight=s.bm25_weight,
                                         vector_weight=s.vector_weight, bm25_adaptive=True,
                                         adaptive_slope=ad.slope, adaptive_floor=ad.floor)}
    if s.fusion_mode == "convex" and s.convex_length_prior:
        refs["fused_no_prior"] = FusionParams.from_settings(s.model_copy(update={"convex_length_prior": False}),
                                                            fusion_calibration)
    return refs


def evaluate(engine, corpus: Corpus, key_to_doc: dict[str, int], sweep: bool = False,
             dump: Path | None = None) -> dict:
    s = engine.settings
    svc = engine.components.retrieval
    refs = reference_params(s, svc.calibration.profile.fusion)
    names = ["bm25", "vector", "union_oracle", *refs, "fused"]
    routes: dict[str, list[list[bool]]] = {r: [] for r in names}
    lat: dict[str, list[float]] = {"bm25": [], "vector": [], "fused": []}
    has_rerank = engine.components.models.cross_encoder is not None
    if has_rerank:
        routes["rerank"], lat["rerank"] = [], []
    sweep_hits: dict[tuple, list[list[bool]]] = {w: [] for w in SWEEP} if sweep else {}
    n_rel: list[int] = []
    dump_f = open(dump, "w", encoding="utf-8") if dump else None
    for q in corpus.questions:
        gold = gold_ids(q, key_to_doc)
        rel = 0  # relevant chunk count (nDCG's ideal ranking)
        for did in gold:
            for ch in engine.components.docs.chunks_of(did):
                rel += q.held_by(ch["text"])
        n_rel.append(rel)
        bundle, fusion, embed_ms = svc.recall(q.text, s)
        row = dump_row(q, rel, fusion, gold)
        routes["bm25"].append(route_hits(row, 1))
        routes["vector"].append(route_hits(row, 2))
        routes["union_oracle"].append(union_oracle(row))
        routes["fused"].append([is_hit(n, q, gold) for n in fusion.fused[:K]])
        cands, hit_of = candidates_from_row(row)
        for name, params in refs.items():
            routes[name].append([hit_of[n.node.node_id] for n in fuse(cands, params, fusion.features)[0][:K]])
        lat["bm25"].append(fusion.ms["bm25"])
        lat["vector"].append(embed_ms + fusion.ms["vector"])
        lat["fused"].append(embed_ms + sum(fusion.ms.values()))
        if has_rerank:
            t0 = time.perf_counter()
            ranked = SafeRerank(engine.components.models.cross_encoder, top_n=K,
                                candidates=s.rerank_candidates).postprocess_nodes(fusion.fused, query_str=q.text)
            lat["rerank"].append(lat["fused"][-1] + (time.perf_counter() - t0) * 1000)
            routes["rerank"].append([is_hit(n, q, gold) for n in ranked[:K]])
        for w in sweep_hits:
            fused = rrf_fuse(fusion.bm25, fusion.vector, s.rrf_k, w[0], w[1])  # fixed weights
            sweep_hits[w].append([is_hit(n, q, gold) for n in fused[:K]])
        if dump_f:  # full-information candidates, for offline fusion studies (tools.eval.fusion_cv)
            dump_f.write(json.dumps(row, ensure_ascii=False) + "\n")
    if dump_f:
        dump_f.close()
    out = {"questions": len(corpus.questions),
           "routes": {r: metrics(routes[r], n_rel, lat.get(r, [])) for r in routes},
           "settings": {"fusion_mode": s.fusion_mode, "convex_auto_weight": s.convex_auto_weight,
                        "convex_bm25_weight": s.convex_bm25_weight, "rrf_k": s.rrf_k,
                        "bm25_weight": s.bm25_weight, "vector_weight": s.vector_weight,
                        "bm25_adaptive": s.bm25_adaptive,
                        "recall_size": s.recall_size, "chunk_size": s.chunk_size,
                        "embedding": engine.components.models.embedding.label}}
    if sweep:
        out["sweep"] = {f"bm25={w[0]},vector={w[1]}": metrics(sweep_hits[w], n_rel, []) for w in SWEEP}
        for v in out["sweep"].values():
            v.pop("p50_ms"), v.pop("p95_ms")
    return out


def rescore_dump(path: Path, s, embedding_model: str = PACKAGED_MODEL_ID) -> dict:
    """Re-fuse the candidates of a --dump file with the given settings and the calibration profile of the model
    the dump was made with (no model, no index: seconds).

    Goes through the engine's own `fuse`, so the arithmetic is the app's; latency is not available here.
    """
    from pipeline.calibration import profile_for

    fusion_calibration = profile_for(embedding_model).profile.fusion
    refs = reference_params(s, fusion_calibration)
    params = FusionParams.from_settings(s, fusion_calibration)
    routes: dict[str, list[list[bool]]] = {r: [] for r in ["bm25", "vector", "union_oracle", *refs, "fused"]}
    n_rel = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            cands, hit_of = candidates_from_row(row)
            feats = row_features(row)  # fusion.query_features of this row's numbers (what the engine computes)
            routes["bm25"].append(route_hits(row, 1))
            routes["vector"].append(route_hits(row, 2))
            routes["union_oracle"].append(union_oracle(row))
            for name, p in [*refs.items(), ("fused", params)]:
                routes[name].append([hit_of[n.node.node_id] for n in fuse(cands, p, feats)[0][:K]])
            n_rel.append(row["n_rel"])
    return {"questions": len(n_rel), "routes": {r: metrics(v, n_rel, []) for r, v in routes.items()}}


def print_table(result: dict, title: str = "") -> None:
    cols = ["hit@1", "hit@3", "hit@5", "hit@10", "mrr@10", "ndcg@10", "p50_ms", "p95_ms"]
    print(f"\n{title}  ({result['questions']} questions)")
    print("| route | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for r, m in result["routes"].items():
        print(f"| {r} | " + " | ".join(str(m.get(c)) for c in cols) + " |")
    if "sweep" in result:
        print("\nweighted RRF sweep (rrf_k=%s)" % result["settings"]["rrf_k"])
        print("| weights | hit@1 | hit@5 | mrr@10 | ndcg@10 |\n|---|---|---|---|---|")
        for w, m in result["sweep"].items():
            print(f"| {w} | {m['hit@1']} | {m['hit@5']} | {m['mrr@10']} | {m['ndcg@10']} |")


def _overrides(args) -> dict:
    return {k: v for k, v in {"bm25_weight": args.bm25_weight, "vector_weight": args.vector_weight,
                              "fusion_mode": args.fusion_mode, "reranker_model_path": args.reranker}.items()
            if v is not None}


def _apply(engine, overrides: dict) -> None:
    if overrides:
        engine.update_settings(overrides)
        if "reranker_model_path" in overrides:
            engine.reload()


def named_set(name: str) -> tuple:
    """(DevSet, Corpus) of a dev set or of one of the formal family's question sets over the regulations knowledge
    base (answerable questions only)."""
    if name == REGULATIONS.name:
        return REGULATIONS, as_corpus()
    if name in OTHER_SETS:
        return REGULATIONS, as_corpus(load_items(OTHER_SETS[name]))
    return DEV_SETS[name], load_corpus(DEV_SETS[name])


def evaluate_set(name: str, cache: Path | None, overrides: dict, sweep: bool = False,
                 dump: Path | None = None) -> dict:
    """One dev set (tools.eval.devsets.DEV_SETS, or the regulations set) on its cached knowledge base (built once
    when missing)."""
    ds, corpus = named_set(name)
    with tempfile.TemporaryDirectory(prefix="kbqa-eval-") as tmp:
        if cache is not None:
            engine, key_to_doc = open_copy(cache, ds, Path(tmp) / "data")
        else:
            from pipeline.engine import Engine  # heavy (Chroma, the models): only where a KB is built

            engine = Engine(Path(tmp) / "data")
            key_to_doc = build_kb(engine, corpus, Path(tmp))
        try:
            _apply(engine, overrides)
            result = evaluate(engine, corpus, key_to_doc, sweep=sweep, dump=dump)
        finally:
            engine.close()
    result["title"] = f"{name} ({ds.style})"
    return result


def run_cv(args) -> dict:
    """Leave-one-set-out: dump every set's candidates once (cached), then fit on all sets but one, score it.
    --families: leave one family of text out instead (devsets.FAMILIES; the regulations set joins by default)."""
    names = args.sets.split(",") if args.sets else [*DEV_SETS, *([REGULATIONS.name] if args.families else [])]
    dump_dir = Path(args.dump_dir)
    dump_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = dump_dir / f"{name}.jsonl"
        if args.redump or not path.exists():
            tmp = path.with_suffix(".tmp")
            res = evaluate_set(name, cache_root(args.kb_cache), _overrides(args), dump=tmp)
            tmp.rename(path)
            print_table(res, res["title"])
    from pipeline.calibration import profile_for

    data = {n: fusion_cv.load_dump(dump_dir / f"{n}.jsonl") for n in names}
    # the dev-set KB cache is built with the packaged e5 (another model: python -m tools.eval.calibrate)
    groups = fusion_cv.family_groups(names) if args.families else None
    result = fusion_cv.cross_validate(data, adaptive=profile_for(PACKAGED_MODEL_ID).profile.fusion.adaptive_rrf,
                                      groups=groups)
    fusion_cv.print_cv(result)
    if args.write_weights:  # the shipped weights: the same procedure fitted on every set
        result["weights"] = fusion_cv.fit_all(data)
        Path(args.write_weights).write_text(json.dumps(result["weights"], indent=2) + "\n", encoding="utf-8")
    return result


def run(args) -> dict:
    from pipeline.engine import Engine  # heavy (Chroma, the models): --help goes without it

    if args.cv:
        result = run_cv(args)
    elif args.from_dump:
        result = rescore_dump(Path(args.from_dump), Settings())
        print_table(result, f"re-fused from {Path(args.from_dump).name} (current fusion defaults)")
    elif args.set:
        result = evaluate_set(args.set, cache_root(args.kb_cache), _overrides(args), args.sweep,
                              Path(args.dump) if args.dump else None)
        print_table(result, result["title"])
    else:
        if args.dureader:
            corpus = load_dureader(Path(args.dureader), args.limit)
            title = f"DuReader {Path(args.dureader).name}"
        else:
            corpus = load_squad(Path(args.squad), args.limit, max_contexts=args.contexts)
            title = f"SQuAD-format {Path(args.squad).name}"
        if args.distractors:
            add_distractors(corpus, Path(args.distractors), args.max_distractors)
            title += f" + distractors {Path(args.distractors).name}"
        with tempfile.TemporaryDirectory(prefix="kbqa-eval-") as tmp:
            engine = Engine(Path(tmp) / "data")
            _apply(engine, _overrides(args))
            key_to_doc = build_kb(engine, corpus, Path(tmp))
            result = evaluate(engine, corpus, key_to_doc, sweep=args.sweep,
                              dump=Path(args.dump) if args.dump else None)
            result["title"] = title
            if args.answers:  # what a user gets: gate → extractive answer (tools/eval/answer_eval.py)
                spans = dureader_spans(Path(args.dureader)) if args.dureader else {}
                result["answers"] = answer_metrics(engine, corpus.questions, spans)
            engine.close()
        print_table(result, title)
        if "answers" in result:
            print_answers(title, result["answers"])
    write_json(args.json, result)
    return result


def main(argv=None) -> int:
    p = command_parser("tools.eval.evaluate", __doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-dump", help="re-fuse a --dump file with the current fusion defaults (no ingest)")
    src.add_argument("--squad", help="SQuAD-format JSON (CMRC 2018, XQuAD)")
    src.add_argument("--dureader", help="DuReader 2.0 JSON lines")
    src.add_argument("--set", choices=[*DEV_SETS, REGULATIONS.name],
                     help="a named dev set (cached KB with --kb-cache)")
    src.add_argument("--cv", action="store_true",
                     help="leave-one-set-out over the dev sets: fit the fusion on all but one, score that one")
    p.add_argument("--kb-cache", default=None, help="cache dir of built dev-set KBs (or $KBQA_KB_CACHE)")
    p.add_argument("--sets", default=None, help="--cv: comma-separated set names (default: all dev sets)")
    p.add_argument("--families", action="store_true",
                   help="--cv: leave one family of text out (encyclopedic / web / formal), not one set")
    p.add_argument("--dump-dir", default="dumps", help="--cv: where the per-set candidate dumps live")
    p.add_argument("--redump", action="store_true", help="--cv: re-run retrieval even if a dump exists")
    p.add_argument("--write-weights", default=None,
                   help="--cv: also fit the auto weight on every set and write that fit as JSON (a report; the "
                        "app reads the calibration profile that `python -m tools.eval.calibrate` writes)")
    p.add_argument("--distractors", help="one document per line (e.g. CRUD-RAG news)")
    p.add_argument("--max-distractors", type=int, default=None)
    p.add_argument("--limit", type=int, default=None, help="number of questions (corpus kept whole for SQuAD)")
    p.add_argument("--contexts", type=int, default=None,
                   help="SQuAD: keep only N contexts (the gold ones of the kept questions + random others)")
    p.add_argument("--json", help="write the metrics as JSON")
    p.add_argument("--sweep", action="store_true", help="also score weighted-RRF variants")
    p.add_argument("--dump", help="write per-question full-information candidates (JSON lines)")
    p.add_argument("--fusion-mode", default=None, choices=["rrf", "convex"])
    p.add_argument("--bm25-weight", type=float, default=None)
    p.add_argument("--vector-weight", type=float, default=None)
    p.add_argument("--reranker", default=None, help="cross-encoder directory to evaluate the rerank route")
    p.add_argument("--answers", action="store_true",
                   help="also run the full answer path per question: answer-hit beside top-1-source-hit "
                        "(tools/eval/answer_eval.py)")
    args = p.parse_args(argv)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
