"""tools/ by kind: every command the docs and help texts name exists under that name, each command's --help
names itself, and the one-off research scripts removed from the tree stay out of it (no module, no import)."""
from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# one-off studies that left the tree (their findings and the commit that measured them: docs/retrieval-eval.md,
# docs/benchmarks.md); a test or a tool importing one of them would import a module that is no longer there
REMOVED = ("fusion_variants", "fusion_stage2", "sentence_cache", "gate_e2e", "bench_embed_layout", "bench_vector_route",
           "vector_route_old", "bench_bm25_delta", "bm25_delta", "subject_dataset", "subject_scan")
COMMAND = re.compile(r"python -m\s+(tools(?:\.\w+)+)")


def _texts() -> dict[str, str]:
    """Where commands are named for a reader: README, docs/, and every Python file's help and messages."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for top in ("tools", "pipeline", "api", "ui", "store", "tests"):
        paths += sorted((ROOT / top).rglob("*.py"))
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in paths}


def test_every_named_command_exists():
    named = {(where, m) for where, text in _texts().items() for m in COMMAND.findall(text)}
    assert len({m for _, m in named}) >= 20  # the scan reads the docs at all (README alone names more)
    missing = sorted((where, m) for where, m in named if importlib.util.find_spec(m) is None)
    assert not missing, f"commands named but not there: {missing}"


def _tool_modules() -> list[Path]:
    return sorted(p for p in (ROOT / "tools").rglob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", _tool_modules(), ids=lambda p: str(p.relative_to(ROOT / "tools")))
def test_a_command_names_itself_in_its_help(path):
    """`prog=` (what --help and usage errors print) is the module's own `python -m` name."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    progs = re.findall(r'(?:prog="python -m |command_parser\(")([\w.]+)"', path.read_text(encoding="utf-8"))
    assert all(p == module for p in progs), (module, progs)


def test_removed_research_scripts_stay_removed():
    for name in REMOVED:
        assert importlib.util.find_spec(f"tools.{name}") is None
        assert not list((ROOT / "tools").rglob(f"{name}.py")), name
    importers = []
    for top in ("tests", "tools", "pipeline", "api", "ui", "store"):
        for p in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] + [a.name for a in node.names] if isinstance(node, ast.ImportFrom)
                         else [])
                if any(part in REMOVED for n in names for part in n.split(".")):
                    importers.append(str(p.relative_to(ROOT)))
    assert not importers, importers
