"""Count instruction-like sentences (pipeline.generation.instructions) on benign text: every flag here is a false
flag. docs/security.md reports the numbers.

    python -m tools.eval.instruction_flags [--cmrc 2000] [--show 20]

Reads in place (never copied): /work/shared/docs (parsed with the app's parsers), CMRC 2018 dev contexts (the
first N unique ones), XQuAD-zh contexts, the DuReader demo documents, the regulations corpus and the CRUD-RAG news
sample (one line = one article). Also counts the markers prompt containment would rewrite in that text.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from pipeline.generation.containment import markers
from pipeline.generation.instructions import flagged_sentences
from tools.eval.devsets import shared_data_dir

DOC_TYPES = {".txt": "txt", ".md": "md", ".pdf": "pdf", ".docx": "docx", ".xlsx": "xlsx", ".csv": "csv"}


def shared_docs(root: Path) -> Iterator[tuple[str, str]]:
    from pipeline.ingestion.parsing import parse_file

    for p in sorted(root.rglob("*")):
        ft = DOC_TYPES.get(p.suffix.lower())
        if not ft or not p.is_file():
            continue
        try:
            parsed = parse_file(p, ft, ocr_enabled=False)
        except Exception as exc:  # an unparseable sample is not our concern here
            print(f"  skip {p.name}: {type(exc).__name__}", file=sys.stderr)
            continue
        yield p.name, "\n".join(page.text for page in parsed.pages)


def squad_contexts(path: Path, limit: int | None) -> Iterator[tuple[str, str]]:
    seen = set()
    for art in json.loads(path.read_text(encoding="utf-8"))["data"]:
        for para in art["paragraphs"]:
            c = para["context"]
            if c not in seen:
                seen.add(c)
                yield f"{path.stem}#{len(seen)}", c
                if limit and len(seen) >= limit:
                    return


def dureader_docs(path: Path) -> Iterator[tuple[str, str]]:
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            for j, d in enumerate(json.loads(line).get("documents") or []):
                yield f"dureader#{i}.{j}", "\n".join(d.get("paragraphs") or [])


def corpora(data: Path, docs: Path, cmrc: int) -> dict[str, Iterator[tuple[str, str]]]:
    out: dict[str, Iterator[tuple[str, str]]] = {"shared/docs": shared_docs(docs)}
    sets = {"cmrc2018 dev": (data / "cmrc2018" / "cmrc2018_dev.json", cmrc),
            "cmrc2018 trial": (data / "cmrc2018" / "cmrc2018_trial.json", None),
            "xquad zh": (data / "xquad" / "xquad.zh.json", None)}
    for name, (p, n) in sets.items():
        if p.exists():
            out[name] = squad_contexts(p, n)
    if (data / "dureader2_demo" / "search.dev.json").exists():
        out["dureader demo"] = dureader_docs(data / "dureader2_demo" / "search.dev.json")
    if (data / "regulations").is_dir():
        out["regulations"] = ((p.name, p.read_text(encoding="utf-8")) for p in sorted((data / "regulations").glob("*.md")))
    news = data / "crud_rag_news" / "documents_dup_part_1_part_1"
    if news.exists():
        out["crud_rag news"] = ((f"news#{i}", t) for i, t in enumerate(news.read_text(encoding="utf-8").splitlines())
                                if t.strip())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cmrc", type=int, default=2000, help="CMRC dev contexts to read (default 2000)")
    ap.add_argument("--show", type=int, default=20, help="flagged sentences to print")
    ap.add_argument("--docs", type=Path, default=shared_data_dir().parent / "docs")
    args = ap.parse_args(argv)
    shown = 0
    total_flags = 0
    for name, items in corpora(shared_data_dir(), args.docs, args.cmrc).items():
        t0, n_texts, n_chars, flags, marked = time.perf_counter(), 0, 0, [], []
        for key, text in items:
            n_texts += 1
            n_chars += len(text)
            flags += [(key, s) for s in flagged_sentences(text)]
            marked += [(key, m) for m in markers(text)]  # what prompt containment would rewrite
        total_flags += len(flags)
        print(f"{name}: {n_texts} texts, {n_chars:,} chars, {len(flags)} flagged sentences, "
              f"{len(marked)} delimiter/role markers ({time.perf_counter() - t0:.1f} s)")
        for key, m in marked[:5]:
            print(f"    marker {key}: {m[:80]}")
        for key, s in flags:
            if shown < args.show:
                print(f"    {key}: {s[:120]}")
                shown += 1
    print(f"total flagged: {total_flags}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
