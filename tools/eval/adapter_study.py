"""A linear query adapter on the packaged embedding model, measured left out by family: can a map fitted on two
families of text make e5-small's question vector rank the third family's passages better?

    python -m tools.eval.adapter_study --packs PACKS [--kb-cache DIR] [--json OUT] [--ranks full,32] [--lams ...]

The question vector q becomes q′ = unit(q + W q) (W = 0 is today's route; the stored passage vectors are untouched,
so a knowledge base would not be re-embedded). W is fitted by a listwise softmax over each training question's
candidates — its gold passages and the raw vector route's top HARD non-gold ones, logits TAU · cos(q′, c) — plus
λ‖W‖², sets weighing alike. Left out by family (tools/eval/devsets.FAMILIES): for each family, each variant (rank,
λ) is scored inside the other two by fitting on one and scoring the other (both ways); the variant with the best
mean gain there (none when none gains) is refitted on both and scored on the left-out family's sets: the vector
route's MRR@10 / Hit@1 over the whole knowledge base, raw and adapted. With --kb-cache the regulations KB's other
question sets (tests/data/regulations_*: dev2, holdout, holdout2) are scored too (formal fold only).

PACKS: tools/eval/prf_pack.py's study packs (`python -m tools.eval.prf_pack --kb-cache DIR --out PACKS`).
"""
from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tools.eval.devsets import FAMILIES, family_of, norm

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


def load_pack(path: Path) -> tuple[SetVecs, dict]:
    with open(path, "rb") as fh:
        p = pickle.load(fh)
    ch = p["chunks"]
    qs = [q for q in p["questions"] if q["gold"]]
    hits = [_hits(ch, set(q["gold"]), q["answers"], q["ws_free"]) for q in qs]
    keep = [i for i, h in enumerate(hits) if len(h)]
    q = np.stack([qs[i]["vec"] for i in keep]).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return SetVecs(p["name"], q, ch["vec"].astype(np.float32), [hits[i] for i in keep], ch["doc"],
                   [set(qs[i]["gold"]) for i in keep]), ch


def formal_extra(reg_chunks: dict, kb_cache: Path, embed) -> list[SetVecs]:
    """The regulations KB's other written question sets, answerable questions, scored on the same passages."""
    from tools.eval.regulations_devset import load_items

    key_to_doc = json.loads((kb_cache / "regulations" / "key_to_doc.json").read_text(encoding="utf-8"))
    repo = Path(__file__).resolve().parents[2]
    out = []
    for name in ("regulations_dev2", "regulations_holdout", "regulations_holdout2"):
        items = load_items(repo / "tests" / "data" / name / "questions.json")
        rows = []
        for a in items.answerable:
            if a.gold.file not in key_to_doc:
                continue
            gold = {key_to_doc[a.gold.file]}
            h = _hits(reg_chunks, gold, [norm(a.gold.span)], True)
            if len(h):
                rows.append((a.question, h, gold))
        qv = np.asarray([embed.get_query_embedding(t) for t, _, _ in rows], dtype=np.float32)
        qv /= np.linalg.norm(qv, axis=1, keepdims=True)
        out.append(SetVecs(name, qv, reg_chunks["vec"].astype(np.float32), [h for _, h, _ in rows],
                           reg_chunks["doc"], [g for _, _, g in rows]))
    return out


def adapted(q: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    if w is None:
        return q
    a = q + q @ w.T
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def route_metrics(s: SetVecs, w: np.ndarray | None) -> dict:
    """The vector route over the whole KB: MRR@10, Hit@1, the first passage's document right, gold in the top 50."""
    qa = adapted(s.q, w)
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
    """(questions, candidate vectors (n, 1 + HARD + P, d), gold mask) of a set: every gold passage (up to P) and the
    raw route's top HARD non-gold ones."""
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
    ap.add_argument("--kb-cache", type=Path, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dumps", type=Path, default=None,
                    help="the --cv dumps (tools.eval.evaluate --cv --dump-dir): also score the fused ranking")
    ap.add_argument("--ranks", default="full,32")
    ap.add_argument("--lams", default="0.001,0.01,0.1")
    ap.add_argument("--fused-only", action="store_true",
                    help="only the fused scoring, with the folds' adapters an earlier run saved in PACKS")
    ap.add_argument("--sets", default="xquad_zh,cmrc_trial,cmrc_dev_news,dureader_dev,dureader_train,regulations")
    args = ap.parse_args(argv)
    if args.fused_only:
        names = [n for n in args.sets.split(",") if (args.dumps / f"{n}.jsonl").exists()]
        report_fused(fused_scoring(args.packs, args.dumps, names), names)
        return 0
    t0 = time.perf_counter()
    sets, reg_chunks = {}, None
    for name in args.sets.split(","):
        if (args.packs / f"{name}.pkl").exists():
            sets[name], ch = load_pack(args.packs / f"{name}.pkl")
            if name == "regulations":
                reg_chunks = ch
    extra = []
    if args.kb_cache and reg_chunks is not None:
        from pipeline.models.embeddings import load_embedding

        repo = Path(__file__).resolve().parents[2]
        extra = formal_extra(reg_chunks, args.kb_cache, load_embedding("", repo, repo / "models").embed_model)
    print(f"# loaded {', '.join(f'{s.name} {len(s.q)}' for s in [*sets.values(), *extra])} "
          f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    batches = {n: training_batch(s) for n, s in sets.items()}
    d = next(iter(sets.values())).q.shape[1]
    base = {n: route_metrics(s, None) for n, s in {**sets, **{e.name: e for e in extra}}.items()}
    variants = [(None if r == "full" else int(r), float(lam)) for r in args.ranks.split(",")
                for lam in args.lams.split(",")]
    fams = {f: [n for n in names if n in sets] for f, names in FAMILIES.items()}
    fams = {f: ns for f, ns in fams.items() if ns}
    results = {"base": base, "folds": {}}
    for fam, held in fams.items():
        others = [f for f in fams if f != fam]
        inner = {}
        for v in variants:
            gains = []
            for a in others:
                for b in others:
                    if a == b:
                        continue
                    w = fit([batches[n] for n in fams[a]], *v, d)
                    gains.append(np.mean([gain(base[n], route_metrics(sets[n], w)) for n in fams[b]]))
            inner[f"{v}"] = float(np.mean(gains)) if gains else 0.0
            print(f"# {fam} left out: variant rank={v[0]} λ={v[1]}: inner gain {inner[f'{v}']:+.4f} "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        best = max(variants, key=lambda v: inner[f"{v}"])
        chosen = best if inner[f"{best}"] > 0 else None
        w = fit([batches[n] for f in others for n in fams[f]], *best, d)
        scored = {n: route_metrics(sets[n], w) for n in held}
        if fam == "formal":
            scored |= {e.name: route_metrics(e, w) for e in extra}
        results["folds"][fam] = {"inner": inner, "best": f"{best}", "chosen": f"{chosen}", "left_out": scored}
        if chosen is not None:  # the fold's adapter, for the fused scoring (--dumps)
            np.save(args.packs / f"adapter_{fam}.npy", w)
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
def adapted_candidates(d, qi: int, qa: np.ndarray):
    """prf_study.candidates with the vector route re-run on the adapted question vector `qa`: the BM25 top-50 of
    the dump ∪ the adapted route's top-50, every candidate's cosine the adapted one (the dumps' cosines are the
    stored vectors' products with the raw vector, so W = 0 gives the dump back)."""
    import math

    from pipeline.retrieval.fusion import query_features
    from tools.eval.fusion_cv import Q
    from tools.eval.prf_study import RECALL, is_hit

    base = d.base[qi]
    sims = d.vec @ qa
    vtop = np.argsort(-sims, kind="stable")[:RECALL]
    vlist = [(int(d.ids[p]), float(sims[p])) for p in vtop]
    rb = {int(c): int(r) for c, r in zip(base.ids, base.rb) if math.isfinite(r)}
    order = sorted(rb, key=rb.get)
    rv = {cid: r for r, (cid, _) in enumerate(vlist, 1)}
    order += [cid for cid, _ in vlist if cid not in rb]
    known = {int(c): i for i, c in enumerate(base.ids)}
    n = len(order)
    sc, hit, ln, sb = np.zeros(n), np.zeros(n, dtype=bool), np.zeros(n), np.zeros(n)
    for i, cid in enumerate(order):
        p = d.pos(cid)
        sc[i] = min(1.0, max(0.0, float(sims[p])))
        j = known.get(cid)
        if j is not None:
            hit[i], ln[i], sb[i] = base.hit[j], base.ln[j], base.sb[j]
        else:
            hit[i] = is_hit(d, qi, p)
            ln[i] = math.inf if int(d.index[p]) > 0 else float(len(d.text[p]))
    q = Q(np.array(order, dtype=np.int64), np.array([rb.get(c, math.inf) for c in order], dtype=np.float64),
          np.array([rv.get(c, math.inf) for c in order], dtype=np.float64), sb, sc, hit, {}, ln)
    q.f = dict(base.f)
    if base.f and vlist:  # the route features the α model reads, from the adapted vector list
        btop = sorted(rb, key=rb.get)[:10]
        feats = query_features([float(base.sb[known[c]]) for c in btop], [c for _, c in vlist[:10]],
                               [str(c) for c in btop], [str(c) for c, _ in vlist[:10]],
                               base.f.get("coverage", 0.0), len(d.questions[qi]["q"]))
        q.f = feats
    return q


def report_fused(fused: dict, names: list[str]) -> None:
    for fam, held in FAMILIES.items():
        if fam not in fused["kept"]:
            continue
        print(f"\n## fused, {fam} left out (MRR@10 / Hit@1): no adapter · kept fusion · refitted fusion")
        for n in held:
            if n in names:
                a, b, c = fused["none"][fam][n], fused["kept"][fam][n], fused["refit"][fam][n]
                print(f"| {n} | {a[0]:.4f} / {a[1]:.4f} | {b[0]:.4f} / {b[1]:.4f} | {c[0]:.4f} / {c[1]:.4f} |")


def fused_scoring(packs: Path, dumps: Path, names: list[str]) -> dict:
    """Each fold's fused MRR@10 / Hit@1 on every set, with no adapter and with the fold's adapter (when one was
    chosen), scored two ways as prf_study does: `kept` (the fold's fusion fitted on the unadapted dumps, applied as
    it is) and `refit` (the fusion refitted on the adapted candidates of the fold's training families)."""
    from pipeline.models.tokenize_zh import ChineseTokenizer
    from tools.eval.prf_study import by_family, kept_alpha, load_set

    tok = ChineseTokenizer()
    sets = {n: load_set(n, packs, dumps, tok) for n in names}
    raw = {n: d.base for n, d in sets.items()}
    none = by_family(raw)
    out = {"none": {f: r["scores"] for f, r in none.items()}, "kept": {}, "refit": {}}
    for fam in none:
        f = packs / f"adapter_{fam}.npy"
        if not f.exists():
            continue
        w = np.load(f)
        data = {n: [adapted_candidates(d, i, adapted(d.questions[i]["vec"][None, :].astype(np.float32), w)[0])
                    for i in range(len(d.questions))] for n, d in sets.items()}
        out["kept"][fam] = kept_alpha(data, {fam: none[fam]["fit"]})[fam]["scores"]
        out["refit"][fam] = by_family(data, only=fam)[fam]["scores"]
    return out


if __name__ == "__main__":
    sys.exit(main())
