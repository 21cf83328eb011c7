"""Follow-up retrieval with and without query rewriting, through the real engine and its answer stream.

    python -m tools.eval.eval_followups [--set tests/data/followups.json] [--docs ../shared/docs]
                                        [--llm-url http://127.0.0.1:8080/v1 --llm-model M] [--json OUT]

Builds a knowledge base of the documents under ../shared/docs (used in place; all but the two novels, or
--only-set-docs for just the set's six), optionally on top of a cached KB of distractors (--base dureader_dev:
3,228 DuReader web paragraphs), in a temp data dir or the shared cache (--cache /work/cache/kb). For each
item, a fresh conversation asks the history questions, then the follow-up, via `Engine.ask` — so the rewrite sees
exactly what it sees in the app (the earlier turns' stored rewritten queries and answers). Modes:

  none   the follow-up retrieved as typed (the rewrite switched off)
  rules  the deterministic rewrite (pipeline.conversation.rewrite.DeterministicRewriter)
  scripted  the LLM rewrite path against a scripted OpenAI-compatible server that answers with the item's
            hand-written `standalone` question (--scripted-llm): plumbing, and the upper bound
  llm    the LLM rewrite with its fall-back (only with --llm-url)

A follow-up hits at k when one of the first k final sources is a chunk of the expected document containing the
expected text. Prints Hit@1/3/5 per mode and the items whose outcome the rewrite changed.
"""
from __future__ import annotations

import fcntl
import json
import shutil
import sys
import tempfile
from pathlib import Path

from pipeline.conversation.rewrite import LLMRewriter, Rewrite
from pipeline.generation.llm_client import build_llm
from pipeline.settings import Settings
from tools.eval.cli import command_parser, write_json

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SET = ROOT / "tests" / "data" / "followups.json"
DEFAULT_DOCS = ROOT.parent / "shared" / "docs"
KS = (1, 3, 5)


class NoRewrite:
    """Stands in for the rewriter: retrieval sees the follow-up exactly as typed."""

    def rewrite(self, question, history):
        return Rewrite(question, question, "none")


def kb_files(docs_root: Path, max_bytes: int) -> list[Path]:
    """Every document the app accepts under ../shared/docs up to max_bytes (the two novels, 1.2–1.8 MB of
    classical Chinese, would triple the build time and add nothing a follow-up could be confused with)."""
    return sorted(p for p in docs_root.rglob("*")
                  if p.suffix.lower() in {".txt", ".md", ".pdf", ".docx"} and p.stat().st_size <= max_bytes)


def build_kb(data_dir: Path, doc_paths: list[Path], base: Path | None = None) -> None:
    """`base`: a READY knowledge base (e.g. the DuReader dev paragraphs) copied first — the distractors."""
    from pipeline.engine import Engine  # heavy (Chroma, the models): only where a KB is built

    if base is not None:
        shutil.copytree(base, data_dir, symlinks=True, ignore=shutil.ignore_patterns("READY", "key_to_doc.json"))
    engine = Engine(data_dir)
    try:
        for i in range(0, len(doc_paths), 10):  # the upload batch limit
            res = engine.upload([(p.name, p) for p in doc_paths[i:i + 10]])
            bad = [r for r in res if not r.ok]
            if bad:
                raise SystemExit(f"upload refused: {bad}")
        engine.wait_idle(7200)
    finally:
        engine.close()


def cached_kb(cache_root: Path | None, name: str, doc_paths: list[Path], work: Path,
              base: Path | None = None) -> Path:
    """A data dir holding the built KB: from the shared cache (flock; build into NAME.tmp, rename, READY),
    copied so the cached dir is never written; or built fresh in `work` without a cache."""
    target = work / "data"
    if cache_root is None:
        build_kb(target, doc_paths, base)
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    ready = cache_root / name
    with open(cache_root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (ready / "READY").exists():
            tmp = cache_root / f"{name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            build_kb(tmp, doc_paths, base)
            shutil.rmtree(ready, ignore_errors=True)
            tmp.rename(ready)
            (ready / "key_to_doc.json").write_text(json.dumps({p.name: str(p) for p in doc_paths},
                                                              ensure_ascii=False, indent=1), encoding="utf-8")
            (ready / "READY").write_text(f"built by tools.eval.eval_followups (base: {base})\n", encoding="utf-8")
    shutil.copytree(ready, target, symlinks=True)
    return target


def run_item(engine, item: dict) -> dict:
    """Ask the history then the follow-up in one conversation; return the follow-up's trace and sources."""
    conv = None
    for q in item["history"]:
        for e in engine.ask(q, conversation_id=conv):
            if e.type == "done":
                conv = e.data["conversation_id"]
            elif e.type == "error":
                raise RuntimeError(f"history question failed: {q}: {e.data}")
    trace, sources = {}, []
    for e in engine.ask(item["follow_up"], conversation_id=conv):
        if e.type == "trace":
            trace = e.data
        elif e.type == "sources":
            sources = e.data["sources"]
        elif e.type == "error":
            raise RuntimeError(f"follow-up failed: {item['follow_up']}: {e.data}")
    # no-answer gate closed → no sources; rank on the fused list then (what retrieval found)
    ranked = [s["chunk_id"] for s in sources] or [r["chunk_id"] for r in trace.get("fused", [])]
    q = trace.get("query") or {}
    return {"query": q.get("query", item["follow_up"]), "method": q.get("method"), "ranked": ranked}


def hit_rank(engine, item: dict, ranked: list[int]) -> int | None:
    rows = engine.components.docs.get_chunks(ranked)
    for i, cid in enumerate(ranked, start=1):
        r = rows.get(cid)
        if r and r["file_name"] == item["doc"] and item["expect"] in r["text"]:
            return i
    return None


def scripted_rewriter(items: list[dict], rules):
    # the scripted server is the tests' own (tests/fake_llm.py): only --scripted-llm needs it
    from tests.fake_llm import FakeLLMServer

    gold = {it["follow_up"]: it["standalone"] for it in items}
    server = FakeLLMServer().start()  # a daemon thread; it ends with the process

    def respond(body: dict) -> str:
        prompt = body["messages"][-1]["content"]
        last = prompt.rsplit("用户最后的问题：", 1)[-1].split("\n", 1)[0].strip()
        return gold.get(last, last)  # a history question (not a scored follow-up) comes back as it is

    server.responder = respond
    llm = build_llm(Settings(llm_api_url=server.base_url, llm_model="fake-model", llm_api_key="k"))
    return LLMRewriter(llm, rules, timeout_s=8.0)


def evaluate(engine, items: list[dict], modes: dict) -> dict:
    out = {}
    for name, rewriter in modes.items():
        engine.components.models.rewriter = rewriter
        rows = []
        for item in items:
            got = run_item(engine, item)
            rows.append({"id": item["id"], "follow_up": item["follow_up"], "query": got["query"],
                         "method": got["method"], "rank": hit_rank(engine, item, got["ranked"])})
        n = len(rows)
        out[name] = {"rows": rows, **{f"hit@{k}": sum(1 for r in rows if r["rank"] and r["rank"] <= k) / n
                                      for k in KS}}
    return out


def main(argv=None) -> int:
    ap = command_parser("tools.eval.eval_followups", __doc__)
    ap.add_argument("--set", type=Path, default=DEFAULT_SET)
    ap.add_argument("--docs", type=Path, default=DEFAULT_DOCS)
    ap.add_argument("--llm-url", default="")
    ap.add_argument("--scripted-llm", action="store_true",
                    help="also the LLM rewrite path against a scripted server answering with the set's `standalone`")
    ap.add_argument("--llm-model", default="local")
    ap.add_argument("--llm-timeout", type=float, default=8.0,
                    help="rewrite timeout (the app's: pipeline.components.REWRITE_TIMEOUT_S)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--only-set-docs", action="store_true",
                    help="KB of the set's own documents only (default: every document under --docs)")
    ap.add_argument("--cache", type=Path, default=None,
                    help="shared KB cache root (e.g. /work/cache/kb): built once, copied per run")
    ap.add_argument("--base", default="",
                    help="name of a READY KB in --cache to add the documents to (e.g. dureader_dev: 3,228 web "
                         "paragraphs as distractors)")
    ap.add_argument("--max-doc-bytes", type=int, default=1_000_000)
    args = ap.parse_args(argv)

    spec = json.loads(args.set.read_text(encoding="utf-8"))
    items = spec["pairs"]
    paths = [args.docs / p for p in spec["docs"]] if args.only_set_docs else kb_files(args.docs, args.max_doc_bytes)
    name = "followup_set_docs" if args.only_set_docs else "shared_docs"
    base = None
    if args.base:
        if args.cache is None or not (args.cache / args.base / "READY").exists():
            raise SystemExit(f"--base {args.base}: no READY knowledge base under --cache {args.cache}")
        base, name = args.cache / args.base, f"{args.base}+{name}"
    from pipeline.engine import Engine  # heavy (Chroma, the models): --help goes without it

    with tempfile.TemporaryDirectory(prefix="kbqa-followups-") as tmp:

        engine = Engine(cached_kb(args.cache, name, paths, Path(tmp), base))
        health = engine.health()
        print(f"knowledge base: {health['docs']} documents, {health['chunks']} chunks ({name})")
        try:
            modes = {"none": NoRewrite(), "rules": engine.components.rule_rewriter}
            if args.scripted_llm:
                # the plumbing with a scripted OpenAI-compatible server (tests/fake_llm.py) that answers each
                # rewrite request with the item's hand-written standalone question: the LLM path end to end,
                # and the upper bound a perfect rewrite reaches
                modes["scripted"] = scripted_rewriter(items, engine.components.rule_rewriter)
            if args.llm_url:
                # the LLM rewrites; answers stay extractive (this measures retrieval, and a small local model
                # generating every history answer would only slow the run down)
                llm = build_llm(Settings(llm_api_url=args.llm_url, llm_model=args.llm_model, llm_api_key="local",
                                         llm_timeout=60))
                modes["llm"] = LLMRewriter(llm, engine.components.rule_rewriter, timeout_s=args.llm_timeout)
            result = evaluate(engine, items, modes)
        finally:
            engine.close()
    n = len(items)
    print(f"follow-up set: {n} items over {len(spec['docs'])} documents ({args.set.name})")
    print("mode    " + "  ".join(f"Hit@{k}" for k in KS))
    for name, r in result.items():
        methods = {}
        for row in r["rows"]:
            methods[row["method"]] = methods.get(row["method"], 0) + 1
        print(f"{name:<7} " + "  ".join(f"{r[f'hit@{k}']:.3f}" for k in KS) + f"   rewrite methods: {methods}")
    base = {r["id"]: r for r in result["none"]["rows"]}
    for name in [m for m in result if m != "none"]:
        print(f"\n-- {name}: items whose Hit@5 changed")
        for r in result[name]["rows"]:
            b = base[r["id"]]
            hb, hr = bool(b["rank"] and b["rank"] <= 5), bool(r["rank"] and r["rank"] <= 5)
            if hb != hr:
                print(f"  #{r['id']:>2} {'+' if hr else '-'} {r['follow_up']} → {r['query']}")
    write_json(args.json, result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
