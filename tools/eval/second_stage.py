"""A second stage over the fused top 20, measured left out by family (what the issue's item 4 asked to try).

    python -m tools.eval.second_stage --kb-cache DIR --dumps DIR --out DIR [--limit N] [--json OUT] [NAME ...]

`--dumps`: the candidate dumps of `python -m tools.eval.evaluate --cv` (DIR/<name>.jsonl, every dev set and
`regulations`). For each set the dump's candidates are fused again with the shipped profile (the engine's own
`fuse`), and each of the top 20 gets what a second stage could read: the best cosine of the question against the
chunk's single sentences (the gate's sentence evidence: e5 passage vectors of `chunk_sentences`), and the
IDF-weighted share of the question's content words in the chunk and in its best sentence, and of its bigrams
(pipeline/retrieval/lexical.py — the gate's lexical coverage). Those rows are kept in OUT/<name>.jsonl, so a
rerun reads them (seconds; `--limit` samples a large set's questions, seeded).

Then, for each family left out (tools/eval/devsets.FAMILIES), every variant rescored as fused + Σ w·feature (each
feature relative to its best value among the 20; the fused score keeps weight 1) with w chosen by coordinate
search on a grid over the other two families (the mean of MRR@10 and Hit@1, every set weighing alike), and the
left-out sets scored beside the fused order. Only the top 20 are reordered: a gold chunk below them stays a miss.
"""
from __future__ import annotations

import json
import random
import sys
import tempfile
from pathlib import Path

import numpy as np

from pipeline.calibration import profile_for
from pipeline.models.paths import PACKAGED_MODEL_ID
from pipeline.models.vectors import TextVectors, unit
from pipeline.retrieval.fusion import FusionParams, fuse
from pipeline.retrieval.lexical import content_bigrams, content_terms, coverage, normalize
from pipeline.retrieval.sentence_evidence import chunk_sentences
from pipeline.settings import Settings
from tools.eval.cli import add_kb_cache, command_parser, kb_cache_root, print_md_table, write_json
from tools.eval.devsets import DEV_SETS, FAMILIES, family_of
from tools.eval.evaluate import K, candidates_from_row
from tools.eval.fusion_cv import row_features
from tools.eval.kb_cache import open_copy
from tools.eval.regulations_devset import REGULATIONS

TOP = 20
SEED = 0
GRID = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
VARIANTS = {  # name → the features added to the fused score
    "sentence cosine": ["s1"],
    "sentence cosine, min-max": ["s1_minmax"],
    "sentence cosine + chunk cosine": ["s1", "cos"],
    "word coverage, chunk": ["cov_chunk"],
    "word coverage, best sentence": ["cov_sentence"],
    "bigram share, chunk": ["grams_chunk"],
    "bigram share, best sentence": ["grams_sentence"],
    "sentence cosine + coverage + bigrams": ["s1", "cov_sentence", "grams_sentence"],
}


def candidate_rows(engine, row: dict, params: FusionParams, vectors: TextVectors) -> dict:
    """The shipped fusion's top 20 of one dump row, each with its second-stage inputs."""
    c = engine.components
    cands, hit_of = candidates_from_row(row)
    top = fuse(cands, params, row_features(row))[0][:TOP]
    texts = {str(k): v["text"] for k, v in c.docs.get_chunks(int(n.node.node_id) for n in top).items()}
    q = unit(c.models.embedding.embed_model.get_query_embedding(row["q"]))
    terms = content_terms(c.tokenizer(row["q"]))
    grams = content_bigrams(c.tokenizer.segments(row["q"]))
    weights = c.bm25.view.weights()
    out = []
    for n in top:
        m = n.node.metadata
        sents = chunk_sentences(texts.get(n.node.node_id, ""))
        norm = [normalize(s) for s in sents]
        whole = "".join(norm)
        share = [sum(g in s for g in grams) / len(grams) if grams else 0.0 for s in norm]
        out.append({"rel": bool(hit_of[n.node.node_id]), "fused": m["fused_score"], "cos": m["similarity"],
                    "s1": float((vectors(sents) @ q).max()),
                    "cov_chunk": coverage(terms, weights, whole),
                    "cov_sentence": max(coverage(terms, weights, s) for s in norm),
                    "grams_chunk": sum(g in whole for g in grams) / len(grams) if grams else 0.0,
                    "grams_sentence": max(share)})
    return {"q": row["q"], "cands": out}


def collect(name: str, root: Path, dumps: Path, out: Path, limit: int | None) -> list[dict]:
    path = out / f"{name}.jsonl"
    if path.exists():
        return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    rows = [json.loads(x) for x in (dumps / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]
    if limit and len(rows) > limit:
        rows = random.Random(SEED).sample(rows, limit)
    params = FusionParams.from_settings(Settings(), profile_for(PACKAGED_MODEL_ID).profile.fusion)
    ds = REGULATIONS if name == REGULATIONS.name else DEV_SETS[name]
    with tempfile.TemporaryDirectory(prefix="kbqa-2nd-") as tmp:
        engine, _ = open_copy(root, ds, Path(tmp) / name)
        try:
            vectors = TextVectors(engine.components.models.embedding.embed_model, cache_size=200_000)
            got = [candidate_rows(engine, r, params, vectors) for r in rows]
        finally:
            engine.close()
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in got), encoding="utf-8")
    print(f"{name}: {len(got)} questions", file=sys.stderr)
    return got


def features(row: dict) -> dict[str, np.ndarray]:
    """Each input relative to its best value among the candidates (a question's scale is its own)."""
    c = row["cands"]
    col = {k: np.array([x[k] if x[k] is not None else np.nan for x in c], dtype=np.float64)
           for k in ("fused", "cos", "s1", "cov_chunk", "cov_sentence", "grams_chunk", "grams_sentence")}
    col["cos"] = np.nan_to_num(col["cos"], nan=np.nanmin(col["cos"]) if np.isfinite(col["cos"]).any() else 0.0)
    f = {k: v - v.max() for k, v in col.items()}
    s1 = col["s1"]
    f["s1_minmax"] = (s1 - s1.min()) / (s1.max() - s1.min() + 1e-9)
    return f


def prepare(rows: list[dict]) -> list[tuple[dict, np.ndarray]]:
    return [(features(r), np.array([x["rel"] for x in r["cands"]])) for r in rows]


def metrics(qs: list[tuple[dict, np.ndarray]], names: list[str], w: list[float]) -> tuple[float, float]:
    """MRR@10 and Hit@1 of fused + Σ w·feature (no names: the fused order as it is)."""
    mrr = hit1 = 0.0
    for f, rel in qs:
        score = f["fused"] + sum(wi * f[n] for n, wi in zip(names, w))
        ranked = rel[np.argsort(-score, kind="stable")]
        first = np.flatnonzero(ranked[:K])
        mrr += 1.0 / (first[0] + 1) if first.size else 0.0
        hit1 += bool(ranked[0])
    return mrr / len(qs), hit1 / len(qs)


def fit(train: list[list[tuple[dict, np.ndarray]]], names: list[str]) -> list[float]:
    """Coordinate search, three sweeps, on ±GRID and 0 for each weight."""
    def objective(w):
        return float(np.mean([np.mean(metrics(qs, names, w)) for qs in train]))
    w = [0.0] * len(names)
    best = objective(w)
    for _ in range(3):
        for j in range(len(names)):
            for g in (0.0, *GRID, *(-x for x in GRID)):
                t = w[:j] + [g] + w[j + 1:]
                v = objective(t)
                if v > best + 1e-9:
                    best, w = v, t
    return w


def left_out(data: dict[str, list[tuple[dict, np.ndarray]]]) -> dict:
    res: dict = {}
    for variant, names in VARIANTS.items():
        for fam in FAMILIES:
            test = [s for s in data if family_of(s) == fam]
            train = [qs for s, qs in data.items() if family_of(s) != fam]
            if not test or not train:
                continue
            w = fit(train, names)
            for s in test:
                base, new = metrics(data[s], [], []), metrics(data[s], names, w)
                res.setdefault(variant, {})[s] = {"weights": dict(zip(names, w)), "questions": len(data[s]),
                                                  "fused": [round(x, 4) for x in base],
                                                  "second_stage": [round(x, 4) for x in new]}
    return res


def main(argv=None) -> int:
    ap = command_parser("tools.eval.second_stage", __doc__)
    add_kb_cache(ap)
    ap.add_argument("--dumps", type=Path, required=True, help="the candidate dumps (evaluate --cv --dump-dir)")
    ap.add_argument("--out", type=Path, required=True, help="where the per-set feature rows are kept")
    ap.add_argument("--limit", type=int, default=800, help="questions sampled from a larger set (seeded)")
    ap.add_argument("--json", default=None)
    ap.add_argument("sets", nargs="*", default=[*DEV_SETS, REGULATIONS.name])
    args = ap.parse_args(argv)
    root = kb_cache_root(ap, args)
    args.out.mkdir(parents=True, exist_ok=True)
    data = {s: prepare(collect(s, root, args.dumps, args.out, args.limit)) for s in args.sets}
    res = left_out(data)
    rows = []
    for variant, per_set in res.items():
        for s, r in per_set.items():
            (bm, bh), (nm, nh) = r["fused"], r["second_stage"]
            rows.append([variant, f"{s} ({family_of(s)})", r["questions"], f"{bm:.4f} / {bh:.4f}", f"{nm:.4f} / {nh:.4f}",
                         f"{100 * (nm - bm):+.2f} / {100 * (nh - bh):+.2f}",
                         ", ".join(f"{k} {v:g}" for k, v in r["weights"].items())])
    print_md_table(["variant", "left-out set", "questions", "fused MRR@10 / Hit@1", "second stage", "change (points)",
                    "weights (fitted without the family)"], rows)
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
