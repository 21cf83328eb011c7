"""Small argument/output helpers shared by the calibration and evaluation commands."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tools.eval.kb_cache import cache_root


def command_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of `python -m <module>` (what --help and usage errors print), its docstring as the help."""
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_kb_cache(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--kb-cache", default=None, help="the dev-set KB cache (tools/eval/kb_cache.py; or $KBQA_KB_CACHE)")


def kb_cache_root(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Path:
    """The cache root from --kb-cache / $KBQA_KB_CACHE, or a usage error naming both."""
    root = cache_root(args.kb_cache)
    if root is None:
        ap.error("--kb-cache DIR (or $KBQA_KB_CACHE) is required")
    return root


def report_fit(label: str, params, loso: dict, json_path: Path | None) -> None:
    """Print the all-sets fit as the constant to ship; write {leave_one_set_out, shipped} when asked."""
    fields = ", ".join(f"{k}={round(v, 4) if isinstance(v, float) else v}" for k, v in params.__dict__.items())
    print(f"\nall sets → {label}({fields})  (python -m tools.eval.calibrate writes it into the profile)")
    if json_path:
        json_path.write_text(json.dumps({"leave_one_set_out": loso, "shipped": params.__dict__}, indent=2,
                                        ensure_ascii=False))


def write_json(path: Path | str | None, data, indent: int = 2) -> None:
    """`--json PATH`: the result as JSON (UTF-8, characters as printed); nothing when no path was given."""
    if path:
        Path(path).write_text(json.dumps(data, ensure_ascii=False, indent=indent), encoding="utf-8")


def print_md_table(header: list[str], rows: list[list]) -> None:
    """A markdown table (docs/retrieval-eval.md takes them as printed)."""
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
