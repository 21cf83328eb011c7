"""A linear query adapter on the packaged embedding model, measured left out by family: can a map fitted on two
families of text make e5-small's question vector rank the third family's passages better?

    python -m tools.eval.adapter_study --packs PACKS [--dumps DUMPS] [--json OUT] [--ranks full,32]
        [--lams 0.001,0.01,0.1] [--gates full,unseen] [--sets …]

The question vector q becomes q′ = unit(q + g · W q) (W = 0 is today's route; the stored passage vectors are
untouched, so a knowledge base would not be re-embedded); g is 1 (`full`) or the IDF share of the question's words
no passage holds (`unseen`). W is fitted by a listwise softmax over each training question's candidates — its gold
passages and the raw vector route's top HARD non-gold ones, logits TAU · cos(q′, c) — plus λ‖W‖², sets weighing
alike. Left out by family (tools/eval/devsets.FAMILIES): for each family, each variant (rank, λ, g) is scored
inside the other two by fitting on one and scoring the other (both ways); the variant with the best mean gain of
½(ΔMRR@10 + ΔHit@1) there (none when none gains) is refitted on both and scored on the left-out family's sets: the
vector route's MRR@10 / Hit@1 over the whole knowledge base, raw and adapted. The formal family's other written
sets (regulations_devset.OTHER_SETS: dev2, holdout, the blind holdout2) are only ever scored, never fitted on.
With --dumps (tools.eval.evaluate --cv --dump-dir) the fused ranking is re-scored too (`fused_scoring`).

PACKS: tools/eval/prf_pack.py's study packs (`python -m tools.eval.prf_pack --kb-cache DIR --out PACKS NAME …`).
Results: docs/retrieval-eval.md, "A linear query adapter fitted left out by family".
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tools.eval.devsets import FAMILIES, norm
from tools.eval.regulations_devset import OTHER_SETS

DEFAULT_SETS = ("xquad_zh", "cmrc_trial", "cmrc_dev_news", "dureader_dev", "dureader_train", "regulations",
                *OTHER_SETS)
SCORED_ONLY = frozenset(OTHER_SETS)  # the formal family's other written sets (one written blind): never fitted on
K = 10
HARD = 63  # non-gold candidates per training question
TAU = 100.0  # e5's own contrastive temperature (0.01)
STEPS = 150


@dataclass
class SetVecs:
    name: str
    q: np.ndarray  # (n, d) unit question vectors
    c: np.ndarray  # (m, d) unit passage vectors of the set's KB
    hits: list[np.ndarray]  # per question, the positions of passages that hold its answer
    doc: np.ndarray  # (m,) document of each passage
    gold_docs: list[set[int]]
    vis: np.ndarray | None = None  # per question, the IDF share of its content words some passage holds


def _hits(chunks: dict, gold: set[int], answers: list[str], ws_free: bool) -> np.ndarray:
    where = np.flatnonzero(np.isin(chunks["doc"], list(gold)))
    if not answers:
        return where
    out = []
    for p in where.tolist():
        t = norm(chunks["text"][p]) if ws_free else chunks["text"][p]
        if any(a in t for a in answers):
            out.append(p)
    return np.array(out, dtype=np.int64)


def visible_shares(weights, texts: list[str]) -> np.ndarray:
    """Each question's IDF share of its content words that some passage holds (the picker's `visible`)."""
    from pipeline.models.tokenize_zh import ChineseTokenizer
    from pipeline.retrieval.lexical import content_terms

    tok = ChineseTokenizer()
    return np.array([weights.visible_share(content_terms(tok(t))) or 1.0 for t in texts])


def load_pack(path: Path) -> SetVecs:
    from pipeline.retrieval.bm25 import SegmentView
    from pipeline.retrieval.bm25_segments import Segment
    from tools.eval.prf_study import K1, B

    with open(path, "rb") as fh:
        p = pickle.load(fh)
    ch = p["chunks"]
    qs = [q for q in p["questions"] if q["gold"]]
    hits = [_hits(ch, set(q["gold"]), q["answers"], q["ws_free"]) for q in qs]
    keep = [i for i, h in enumerate(hits) if len(h)]
    q = np.stack([qs[i]["vec"] for i in keep]).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    seg = Segment.build(p["name"], zip(ch["ids"].tolist(), ch["tokens"]))
    weights = SegmentView((seg,), (np.ones(seg.size, dtype=bool),), K1, B).weights()
    vis = visible_shares(weights, [qs[i]["q"] for i in keep])
    return SetVecs(p["name"], q, ch["vec"].astype(np.float32), [hits[i] for i in keep], ch["doc"],
                   [set(qs[i]["gold"]) for i in keep], vis)


def adapted(q: np.ndarray, w: np.ndarray | None, g: np.ndarray | None = None) -> np.ndarray:
    """unit(q + g · W q) per row; g None: 1 (the map at full strength)."""
    if w is None:
        return q
    d = q @ w.T
    a = q + (d if g is None else g[:, None] * d)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def gate_of(s: SetVecs, gate: str) -> np.ndarray | None:
    """"full": the map on every question; "unseen": at the strength of the question's share of words no passage of
    the KB holds (1 − visible): a question in the documents' own words keeps its raw vector."""
    return None if gate == "full" else 1.0 - s.vis


def route_metrics(s: SetVecs, w: np.ndarray | None, gate: str = "full") -> dict:
    """The vector route over the whole KB: MRR@10, Hit@1, the first passage's document right, gold in the top 50."""
    qa = adapted(s.q, w, gate_of(s, gate))
    rr, h1, doc1, r50 = [], [], [], []
    for i in range(len(qa)):
        sc = s.c @ qa[i]
        best_hit = sc[s.hits[i]].max()
        rank = int((sc > best_hit).sum()) + 1
        rr.append(1.0 / rank if rank <= K else 0.0)
        h1.append(rank == 1)
        r50.append(rank <= 50)
        doc1.append(int(s.doc[int(np.argmax(sc))]) in s.gold_docs[i])
    return {"n": len(qa), "mrr": float(np.mean(rr)), "h1": float(np.mean(h1)), "doc1": float(np.mean(doc1)),
            "r50": float(np.mean(r50))}


def training_batch(s: SetVecs):
    """One set's training tensors: its questions (n, d), each question's candidates (n, P + HARD, d) — its gold
    passages (up to P, the best first) and the raw route's top HARD non-gold ones — and two masks (n, P + HARD):
    gold, and valid (the empty gold slots and any padding left out of the softmax)."""
    import torch

    P = max(1, min(8, max(len(h) for h in s.hits)))
    cands, golds, valids = [], [], []
    for i in range(len(s.q)):
        sc = s.c @ s.q[i]
        gold = s.hits[i][np.argsort(-sc[s.hits[i]])][:P]
        is_gold = set(s.hits[i].tolist())
        neg = np.array([p for p in np.argsort(-sc)[:HARD + len(is_gold)] if p not in is_gold][:HARD], dtype=np.int64)
        # slots: [0, len(gold)) gold, [len(gold), P) empty, then the negatives (padded when the KB is tiny)
        idx = np.concatenate([gold, np.full(P - len(gold), gold[0]), neg])
        idx = np.concatenate([idx, np.full(P + HARD - len(idx), idx[-1])])
        g = np.zeros(P + HARD, dtype=bool)
        g[:len(gold)] = True
        v = np.ones(P + HARD, dtype=bool)
        v[len(gold):P] = False
        v[P + len(neg):] = False
        cands.append(s.c[idx])
        golds.append(g)
        valids.append(v)
    return (torch.tensor(s.q), torch.tensor(np.stack(cands)), torch.tensor(np.stack(golds)),
            torch.tensor(np.stack(valids)))


def fit(batches: list, rank: int | None, lam: float, d: int, seed: int = 0) -> np.ndarray:
    """W (d × d; of rank `rank` when given) minimising the mean over `batches` (sets alike) of the listwise loss
    −log Σ_gold softmax(TAU · cos(q′, c)), plus λ‖W‖²: STEPS full-batch Adam steps from W = 0."""
    import torch

    torch.manual_seed(seed)
    if rank is None:
        params = [torch.zeros(d, d, requires_grad=True)]
        weight = lambda: params[0]  # noqa: E731
    else:
        params = [torch.randn(d, rank) * 0.01, torch.zeros(rank, d)]
        for p in params:
            p.requires_grad_(True)
        weight = lambda: params[0] @ params[1]  # noqa: E731
    opt = torch.optim.Adam(params, lr=2e-3)
    for _ in range(STEPS):
        opt.zero_grad()
        w = weight()
        loss = lam * (w * w).sum()
        for q, c, gold, valid in batches:
            qa = q + q @ w.T
            qa = qa / qa.norm(dim=1, keepdim=True)
            logits = TAU * torch.einsum("nd,nkd->nk", qa, c)
            logits = logits.masked_fill(~valid, -1e9)
            lse_all = torch.logsumexp(logits, dim=1)
            lse_gold = torch.logsumexp(logits.masked_fill(~gold, -1e9), dim=1)
            loss = loss + (lse_all - lse_gold).mean() / len(batches)
        loss.backward()
        opt.step()
    return weight().detach().numpy().astype(np.float32)


def gain(before: dict, after: dict) -> float:
    return 0.5 * ((after["mrr"] - before["mrr"]) + (after["h1"] - before["h1"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.eval.adapter_study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packs", required=True, type=Path)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dumps", type=Path, default=None,
                    help="the --cv dumps (tools.eval.evaluate --cv --dump-dir): also score the fused ranking")
    ap.add_argument("--ranks", default="full,32")
    ap.add_argument("--lams", default="0.001,0.01,0.1")
    ap.add_argument("--gates", default="full,unseen")
    ap.add_argument("--sets", default=",".join(DEFAULT_SETS))
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    sets = {n: load_pack(args.packs / f"{n}.pkl") for n in args.sets.split(",") if (args.packs / f"{n}.pkl").exists()}
    print(f"# loaded {', '.join(f'{s.name} {len(s.q)}' for s in sets.values())} ({time.perf_counter() - t0:.0f} s)",
          file=sys.stderr)
    batches = {n: training_batch(s) for n, s in sets.items() if n not in SCORED_ONLY}
    d = next(iter(sets.values())).q.shape[1]
    base = {n: route_metrics(s, None) for n, s in sets.items()}
    fits = [(None if r == "full" else int(r), float(lam)) for r in args.ranks.split(",") for lam in args.lams.split(",")]
    gates = args.gates.split(",")
    fams = {f: [n for n in names if n in sets] for f, names in FAMILIES.items()}
    fams = {f: ns for f, ns in fams.items() if ns}
    train = {f: [n for n in ns if n in batches] for f, ns in fams.items()}
    results = {"base": base, "folds": {}}
    fitted: dict[tuple, np.ndarray] = {}

    def fit_on(names: list[str], v: tuple) -> np.ndarray:
        """W fitted on these sets (each single-family fit serves two folds' inner choice)."""
        key = (tuple(names), v)
        if key not in fitted:
            fitted[key] = fit([batches[n] for n in names], *v, d)
        return fitted[key]

    for fam, held in fams.items():
        others = [f for f in fams if f != fam and train[f]]
        inner: dict[str, list[float]] = {}
        for v in fits:
            for a in others:
                for b in others:
                    if a != b:
                        w = fit_on(train[a], v)
                        for g in gates:
                            inner.setdefault(f"{v + (g,)}", []).append(float(np.mean(
                                [gain(base[n], route_metrics(sets[n], w, g)) for n in train[b]])))
            print(f"# {fam} left out: rank={v[0]} λ={v[1]}: inner gain " + ", ".join(
                f"{g} {np.mean(inner[f'{v + (g,)}']):+.4f}" for g in gates) + f" ({time.perf_counter() - t0:.0f} s)",
                file=sys.stderr)
        mean = {k: float(np.mean(x)) for k, x in inner.items()}
        best = max(((v, g) for v in fits for g in gates), key=lambda x: mean[f"{x[0] + (x[1],)}"])
        chosen = best if mean[f"{best[0] + (best[1],)}"] > 0 else None
        w = fit_on([n for f in others for n in train[f]], best[0])
        scored = {n: route_metrics(sets[n], w, best[1]) for n in held}
        results["folds"][fam] = {"inner": mean, "best": f"{best}", "chosen": f"{chosen}", "left_out": scored}
        if chosen is not None:  # the fold's adapter, for the fused scoring (--dumps)
            np.save(args.packs / f"adapter_{fam}.npy", w)
            (args.packs / f"adapter_{fam}.gate").write_text(best[1])
        else:
            (args.packs / f"adapter_{fam}.npy").unlink(missing_ok=True)
    for fam, r in results["folds"].items():
        print(f"\n## {fam} left out — chosen on the others: {r['chosen']} (best inner {r['best']})")
        print("| set | n | raw MRR@10 / Hit@1 / doc first / top-50 | adapted |")
        print("|---|---|---|---|")
        for n, m in r["left_out"].items():
            b = base[n]
            print(f"| {n} | {m['n']} | {b['mrr']:.4f} / {b['h1']:.4f} / {b['doc1']:.3f} / {b['r50']:.3f} | "
                  f"{m['mrr']:.4f} / {m['h1']:.4f} / {m['doc1']:.3f} / {m['r50']:.3f} |")
    if args.dumps:
        names = [n for n in sets if (args.dumps / f"{n}.jsonl").exists()]
        results["fused"] = fused_scoring(args.packs, args.dumps, names)
        report_fused(results["fused"], names)
    if args.json:
        Path(args.json).write_text(json.dumps(results, ensure_ascii=False, indent=1), encoding="utf-8")
    return 0


# ------------------------------------------------------------------------------------------ the fused ranking
def adapted_candidates(d, qi: int, qa: np.ndarray) -> tuple:
    """The question's candidates with the vector route re-run on the adapted question vector `qa`
    (prf_study.candidates; W = 0 gives the dump back), and the same with the α model's features of the raw route."""
    from tools.eval.prf_study import candidates, original_weights, weighted_scores

    q, _ = candidates(d, qi, weighted_scores(d.view, original_weights(d.qtokens[qi])), qv=qa)
    return q, dataclasses.replace(q, f=dict(d.base[qi].f))


def report_fused(fused: dict, names: list[str]) -> None:
    for fam, held in FAMILIES.items():
        if fam not in fused["kept"]:
            continue
        print(f"\n## fused, {fam} left out (MRR@10 / Hit@1): no adapter · kept fusion · kept, α from the raw "
              "route · refitted fusion")
        for n in held:
            if n in names:
                row = [fused[k][fam][n] for k in ("none", "kept", "kept_raw_alpha", "refit")]
                print(f"| {n} | " + " | ".join(f"{m:.4f} / {h:.4f}" for m, h in row) + " |")


def fused_scoring(packs: Path, dumps: Path, names: list[str]) -> dict:
    """Each fold's fused MRR@10 / Hit@1 on its left-out sets, with no adapter and with the fold's adapter (when one
    was chosen), scored as prf_study does: `kept` (the fold's fusion fitted on the unadapted dumps, applied as it
    is), `kept_raw_alpha` (the same, the α model reading the raw route's features) and `refit` (the fusion
    refitted on the adapted candidates of the fold's training families). The formal family's other written sets
    are scored in the formal fold only, never fitted on."""
    from pipeline.models.tokenize_zh import ChineseTokenizer
    from tools.eval.prf_study import by_family, kept_alpha, load_set

    tok = ChineseTokenizer()
    sets = {n: load_set(n, packs, dumps, tok) for n in names}
    out: dict = {k: {} for k in ("none", "kept", "kept_raw_alpha", "refit")}
    for fam, held in FAMILIES.items():
        f = packs / f"adapter_{fam}.npy"
        mine = [n for n in names if n in held or n not in SCORED_ONLY]
        if not f.exists() or not any(n in held for n in mine):
            continue
        w, gate = np.load(f), (packs / f"adapter_{fam}.gate").read_text()
        raw = {n: sets[n].base for n in mine}
        none = by_family(raw, only=fam)[fam]
        out["none"][fam] = none["scores"]
        data, data_raw_alpha = {}, {}
        for n in mine:
            d = sets[n]
            qv = np.stack([q["vec"] for q in d.questions]).astype(np.float32)
            qv /= np.linalg.norm(qv, axis=1, keepdims=True)
            g = None if gate == "full" else 1.0 - visible_shares(d.view.weights(), [q["q"] for q in d.questions])
            qa = adapted(qv, w, g)
            data[n], data_raw_alpha[n] = map(list, zip(*(adapted_candidates(d, i, qa[i]) for i in range(len(qa)))))
        out["kept"][fam] = kept_alpha(data, {fam: none["fit"]})[fam]["scores"]
        out["kept_raw_alpha"][fam] = kept_alpha(data_raw_alpha, {fam: none["fit"]})[fam]["scores"]
        out["refit"][fam] = by_family(data, only=fam)[fam]["scores"]
    return out


if __name__ == "__main__":
    sys.exit(main())
