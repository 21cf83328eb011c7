"""Leave-one-set-out study of a second stage over the fused list: best-sentence e5 cosine of the top-N candidates.

    python -m tools.fusion_stage2 --dump-dir DIR --sent-dir DIR [--json OUT]

Stage 1 is the shipped fusion procedure (tools.fusion_cv: convex min-max, logistic α), fitted on the training
sets. Stage 2 re-orders its top N (20) by (1 − γ)·N(fused) + γ·N(best-sentence cosine), N = min-max over those
N; candidates below N keep their order. The best-sentence cosine of a chunk is the max over its sentences of
cos(query, sentence) (tools.sentence_cache: the same e5, passage prefix). γ is fitted on the training sets with
the same objective as α (mean over sets of ½(ΔMRR@10 + ΔHit@1) against each set's better route) and scored on
the left-out set. Also printed: a paired bootstrap of each set's MRR@10 / Hit@1 difference to the better route,
so the reader knows what is noise on the ~97-question DuReader sets.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from pipeline.retrieval.fusion import minmax
from tools import fusion_cv as cv

GAMMAS = np.round(np.linspace(0.0, 1.0, 21), 2)
TOP_N = 20


def best_sentence_cos(qs: list[cv.Q], sent_file: Path, windows: bool = False) -> list[np.ndarray]:
    """Per question, per candidate: max cosine of the query with one of the chunk's sentences (with `windows`,
    also with the normalised mean of two neighbouring sentences)."""
    z = np.load(sent_file)
    pos = {int(c): i for i, c in enumerate(z["chunk_ids"])}
    starts, sent, qv = z["starts"], z["sent"].astype(np.float32), z["queries"]
    out = []
    for qi, q in enumerate(qs):
        vals = np.zeros(len(q.ids))
        for j, cid in enumerate(q.ids):
            i = pos[int(cid)]
            v = sent[starts[i]:starts[i + 1]]
            if windows and len(v) > 1:
                w = v[:-1] + v[1:]
                v = np.vstack([v, w / np.linalg.norm(w, axis=1, keepdims=True)])
            vals[j] = float((v @ qv[qi]).max())
        out.append(vals)
    return out


def stage1(q: cv.Q, alpha: float, norm: str = "minmax") -> np.ndarray:
    m = np.ones(len(q.ids), dtype=bool)
    return alpha * cv.normed(q.sb, m, norm) + (1 - alpha) * cv.normed(q.sc, m, norm)


def stage2_scores(s1: np.ndarray, ss: np.ndarray, ids: np.ndarray, gamma: float, n: int = TOP_N) -> np.ndarray:
    """Stage-2 scores: the top n of s1 (ties by chunk id) re-scored and kept above the rest, which keep s1."""
    order = np.lexsort((ids, -s1))
    top, rest = order[:n], order[n:]
    out = np.empty_like(s1)
    out[top] = 2.0 + (1 - gamma) * minmax(s1[top]) + gamma * minmax(ss[top])
    out[rest] = minmax(s1)[rest]  # in [0, 1]: below every re-scored candidate (≥ 2)
    return out


def gamma_grid(q: cv.Q, s1: np.ndarray, ss: np.ndarray, n: int = TOP_N) -> np.ndarray:
    return np.array([cv.first_hit_rank(stage2_scores(s1, ss, q.ids, g, n), q) for g in GAMMAS])


def fit_gamma(grids: dict[str, np.ndarray], best: dict[str, tuple[float, float]]) -> float:
    """γ of the grid maximising the mean over the training sets of ½(ΔMRR + ΔHit@1) (ties: the smallest γ)."""
    score = []
    for gi in range(len(GAMMAS)):
        tot = 0.0
        for s, r in grids.items():
            col = r[:, gi]
            mrr = float(np.where(col <= cv.K, 1.0 / col, 0.0).mean())
            tot += 0.5 * ((mrr - best[s][0]) + (float((col <= 1).mean()) - best[s][1]))
        score.append(tot / len(grids))
    return float(GAMMAS[int(np.argmax(np.array(score) + 1e-12 * -np.arange(len(GAMMAS))))])




def rr(ranks) -> np.ndarray:
    r = np.asarray(ranks, float)
    return np.where(r <= cv.K, 1.0 / r, 0.0)


def study(data: dict[str, list[cv.Q]], ss: dict[str, list[np.ndarray]], n: int = TOP_N) -> dict:
    grids1 = cv.prepare(data, "minmax")
    out: dict = {"sets": {}, "top_n": n}
    for held in data:
        train = [s for s in data if s != held]
        m = cv.fit("convex_auto", {s: grids1[s] for s in train}, data, "minmax")
        s1 = {s: [stage1(q, a) for q, a in zip(data[s], m.alphas(data[s]))] for s in data}
        g2 = {s: np.array([gamma_grid(q, a, b, n) for q, a, b in zip(data[s], s1[s], ss[s])]) for s in train}
        best = {s: cv.best_route(data[s]) for s in train}
        gamma = fit_gamma(g2, best)
        qs = data[held]
        base = cv.baselines(qs)  # the routes, the oracle and RRF (adaptive RRF is not compared here)
        r1 = [cv.first_hit_rank(x, q) for q, x in zip(qs, s1[held])]
        r2 = [cv.first_hit_rank(stage2_scores(x, y, q.ids, gamma, n), q) for q, x, y in zip(qs, s1[held], ss[held])]
        br = max(("bm25", "vector"), key=lambda k: base[k]["mrr@10"])
        rb = [cv.route_rank(q, q.rb if br == "bm25" else q.rv) for q in qs]
        res = {"questions": len(qs), "best_route": br, "gamma": gamma, "routes": base,
               "stage1": cv.summarize(r1), "stage2": cv.summarize(r2)}
        for name, r in (("stage1", r1), ("stage2", r2)):
            res[f"{name}_vs_best"] = {"mrr@10": cv.paired_bootstrap(rr(r), rr(rb)),
                                      "hit@1": cv.paired_bootstrap(np.asarray(r) <= 1, np.asarray(rb) <= 1)}
        out["sets"][held] = res
    out["average"] = {k: {m: round(float(np.mean([r[k][m] for r in out["sets"].values()])), 4)
                          for m in ("mrr@10", "hit@1", "hit@5")} for k in ("stage1", "stage2")}
    return out


def _f(m: dict) -> str:
    return f"{m['mrr@10']}/{m['hit@1']}/{m['hit@5']}"


def print_study(res: dict) -> None:
    print(f"| left-out set | best route | γ | stage 1 MRR/H1/H5 | stage 2 (top {res['top_n']}) MRR/H1/H5 | "
          "Δ MRR vs best (s1 ± se) | Δ MRR vs best (s2 ± se) | Δ H1 vs best (s2 ± se) |")
    print("|---|---|---|---|---|---|---|---|")
    for s, r in res["sets"].items():
        b = r["routes"][r["best_route"]]
        d1, d2 = r["stage1_vs_best"]["mrr@10"], r["stage2_vs_best"]["mrr@10"]
        h2 = r["stage2_vs_best"]["hit@1"]
        print(f"| {s} | {r['best_route']} {_f(b)} | {r['gamma']} | {_f(r['stage1'])} | {_f(r['stage2'])} | "
              f"{d1['diff']:+.4f} ± {d1['se']} | {d2['diff']:+.4f} ± {d2['se']} | {h2['diff']:+.4f} ± {h2['se']} |")
    a = res["average"]
    print(f"| average | | | {a['stage1']['mrr@10']}/{a['stage1']['hit@1']}/{a['stage1']['hit@5']} | "
          f"{a['stage2']['mrr@10']}/{a['stage2']['hit@1']}/{a['stage2']['hit@5']} | | | |")


def latency(kb_dir: Path, qs: list[cv.Q], questions: list[str], n_q: int = 30, n: int = TOP_N) -> dict:
    """What the second stage would cost at query time without stored sentence vectors: embed the sentences of
    the top-n chunks (stage-1 order at the shipped α) per question, beside embedding the question itself
    (which retrieval does anyway), same process, same model, p50 over n_q questions."""
    import sqlite3
    import time

    from pipeline.calibration import profile_for
    from pipeline.models.e5_convert import PASSAGE_PREFIX, QUERY_PREFIX
    from pipeline.models.embeddings import load_embedding
    from pipeline.models.paths import PACKAGED_MODEL_ID
    from pipeline.retrieval.fusion import auto_weight
    from tools.sentence_cache import REPO, chunk_sentences

    fusion = profile_for(PACKAGED_MODEL_ID).profile.fusion  # the dumps are the packaged e5's

    emb = load_embedding("", REPO, REPO / "models").embed_model
    con = sqlite3.connect(f"file:{kb_dir / 'app.db'}?mode=ro", uri=True)
    q_ms, s_ms, counts = [], [], []
    for q, text in list(zip(qs, questions))[:n_q]:
        s1 = stage1(q, auto_weight(q.f, fusion.alpha_model["minmax"]) if q.f else 0.25)
        top = [int(q.ids[i]) for i in np.lexsort((q.ids, -s1))[:n]]
        sents = [PASSAGE_PREFIX + x for cid in top for x in chunk_sentences(
            con.execute("SELECT text FROM kb_chunk WHERE chunk_id = ?", (cid,)).fetchone()[0])]
        t0 = time.perf_counter()
        emb.embed_raw([QUERY_PREFIX + text])
        t1 = time.perf_counter()
        emb.embed_raw(sents)
        q_ms.append((t1 - t0) * 1000)
        s_ms.append((time.perf_counter() - t1) * 1000)
        counts.append(len(sents))
    con.close()
    return {"questions": len(q_ms), "query_embed_p50_ms": round(float(np.median(q_ms)), 1),
            "stage2_embed_p50_ms": round(float(np.median(s_ms)), 1),
            "sentences_p50": int(np.median(counts))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.fusion_stage2", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump-dir", required=True)
    ap.add_argument("--sent-dir", required=True)
    ap.add_argument("--sets", default="cmrc_dev_news,cmrc_trial,xquad_zh,dureader_dev,dureader_train")
    ap.add_argument("--top-n", type=int, default=TOP_N)
    ap.add_argument("--windows", action="store_true", help="also two-sentence windows")
    ap.add_argument("--json", default=None)
    ap.add_argument("--latency", default=None, metavar="SET",
                    help="also time embedding the top-N chunks' sentences per question on SET (needs --kb-cache)")
    ap.add_argument("--kb-cache", default=None)
    args = ap.parse_args(argv)
    names = args.sets.split(",")
    data = {s: cv.load_dump(Path(args.dump_dir) / f"{s}.jsonl") for s in names}
    ss = {s: best_sentence_cos(data[s], Path(args.sent_dir) / f"{s}.npz", args.windows) for s in names}
    res = study(data, ss, args.top_n)
    print_study(res)
    if args.latency:
        qtext = [json.loads(line)["q"] for line in open(Path(args.dump_dir) / f"{args.latency}.jsonl",
                                                         encoding="utf-8")]
        res["latency"] = latency(Path(args.kb_cache) / args.latency, data[args.latency], qtext, n=args.top_n)
        print(f"latency on {args.latency}: {res['latency']}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
