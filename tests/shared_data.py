"""Where the real test documents and data sets live: `../shared` beside the checkout, used in place and never
copied into the repo (licences: see the SOURCE.txt files there).

    from tests.shared_data import DOCS, needs
    pytestmark = needs(DOCS)                       # every test of the module
    @needs(DATA / "xquad" / "xquad.zh.json")       # one test

A test that needs a missing path is skipped with that path named; with CI=true it fails instead (CI lays
shared/ beside its clone, so a missing one there is a broken set-up, not a reason to test less). `require(path)`
does the same from inside a test or fixture. The check runs when the test starts (conftest.py), so a module
whose data is missing is still collected.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _shared_dir() -> Path:
    """`../shared` beside the checkout; in a git worktree (whose `.git` is a file naming the main checkout's
    `.git/worktrees/NAME`) also the one beside the main checkout. KBQA_SHARED_DIR overrides both."""
    if os.environ.get("KBQA_SHARED_DIR"):
        return Path(os.environ["KBQA_SHARED_DIR"])
    candidates = [ROOT.parent / "shared"]
    git = ROOT / ".git"
    if git.is_file():
        text = git.read_text(encoding="utf-8", errors="replace").strip()
        if text.startswith("gitdir:"):
            main_git = Path(text[len("gitdir:"):].strip()).parents[1]  # <main>/.git
            candidates.append(main_git.parent.parent / "shared")
    return next((c for c in candidates if c.is_dir()), candidates[0])


SHARED = _shared_dir()
DOCS = SHARED / "docs"  # third-party documents (txt / md / pdf / docx, GBK files, scanned pages)
DATA = SHARED / "data"  # QA data sets (CMRC 2018, XQuAD, DuReader, CRUD-RAG)
RULES = DOCS / "chatchat" / "人民检察院行政诉讼监督规则（试行）(2016-04-15).md"  # a real Chinese regulation
NOVEL = DOCS / "gbk" / "sanguoyanyi_gbk.txt"  # 三国演义 in GBK: the long document


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(path: Path) -> None:
    """Skip (locally) or fail (CI=true) the running test because `path` is not there."""
    msg = f"test data missing: {path} (the ../shared folder beside the checkout; KBQA_SHARED_DIR overrides it)"
    if in_ci():
        pytest.fail(msg)
    pytest.skip(msg)


def require(*paths: Path) -> Path:
    """Each of `paths` exists, or the running test skips / fails naming the first missing one. Returns the first."""
    for p in paths:
        if not Path(p).exists():
            missing(Path(p))
    return paths[0]


def needs(*paths: Path) -> pytest.MarkDecorator:
    """A mark: the test (or module, as `pytestmark`) needs these paths; checked by conftest.py at test start."""
    return pytest.mark.needs_shared(*paths)
