"""A lean stand-in for `tokenizers.Tokenizer` on SentencePiece-Unigram tokenizer.json files (multilingual-e5).

Why: `tokenizers` keeps e5's 250k pieces in a byte trie with a hash map per node — +281 MB of resident memory
in the serving process, a third of it (docs/benchmarks.md). The same Viterbi search over a plain dict
piece → id and a list of scores costs ~40 MB. The normaliser (SentencePiece's precompiled charsmap + the
space collapse) and the Metaspace pre-tokeniser still run in `tokenizers` itself, loaded from the same file
with the vocabulary cut to its special pieces, so only the search is re-implemented — exactly as
tokenizers' `Unigram::encode_optimized` does it (score ties keep the shorter piece found first, characters
without a piece become <unk> scored min_score − 10, consecutive <unk> are fused), plus the added-token split
and the <s> … </s> template. tests/test_unigram_tokenizer.py checks the ids are identical on real text.

`load_tokenizer(path)` returns this class for such files and `tokenizers.Tokenizer` for anything else (or for
every file with KBQA_EMBED_TOKENIZER=tokenizers: tools/bench/bench_retrieval prints both in the same run).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

UNK_PENALTY = 10.0  # tokenizers' K_UNK_PENALTY
BACKEND_ENV = "KBQA_EMBED_TOKENIZER"  # "lean" (default) | "tokenizers": the library's own Unigram (benchmarks)


@dataclass
class Encoding:
    ids: list[int]


class UnigramTokenizer:
    """encode / encode_batch / token_to_id / enable_truncation / no_padding: what the ONNX runner uses."""

    def __init__(self, spec: dict):
        model = spec["model"]
        vocab = model["vocab"]
        self.piece_id = {p: i for i, (p, _) in enumerate(vocab)}
        self.scores = [float(s) for _, s in vocab]
        self.unk_id = int(model["unk_id"])
        self.unk_score = min(self.scores) - UNK_PENALTY
        self.longest: dict[str, int] = {}  # first character → length of the longest piece it starts (fewer tries)
        for p, _ in vocab:
            if p and len(p) > self.longest.get(p[0], 0):
                self.longest[p[0]] = len(p)
        self.max_length: int | None = None
        self.prefix, self.suffix = _template(spec.get("post_processor"), self.piece_id)
        added = sorted(spec.get("added_tokens") or [], key=lambda t: -len(t["content"]))
        self.added = {t["content"]: t["id"] for t in added}
        self._added_re = re.compile("|".join(
            (r"\s*" if t.get("lstrip") else "") + re.escape(t["content"]) + (r"\s*" if t.get("rstrip") else "")
            for t in added)) if added else None
        from tokenizers import Tokenizer

        light = dict(spec, model={**model, "vocab": vocab[:self.unk_id + 1]})
        light["added_tokens"], light["post_processor"] = [], None
        self._pipe = Tokenizer.from_str(json.dumps(light))  # normaliser + pre-tokeniser, no big trie

    @classmethod
    def from_file(cls, path: str | Path) -> "UnigramTokenizer":
        return cls(json.loads(Path(path).read_text(encoding="utf-8")))

    # -- the tokenizers.Tokenizer surface the runner uses
    def no_padding(self) -> None:
        pass

    def enable_truncation(self, max_length: int) -> None:
        self.max_length = int(max_length)

    def token_to_id(self, token: str) -> int | None:
        return self.added.get(token, self.piece_id.get(token))

    def encode_batch(self, texts: list[str]) -> list[Encoding]:
        return [self.encode(t) for t in texts]

    def encode(self, text: str) -> Encoding:
        ids: list[int] = []
        pos = 0
        for m in (self._added_re.finditer(text) if self._added_re else ()):
            ids += self._plain(text[pos:m.start()])
            ids.append(self.added[m.group(0).strip()])
            pos = m.end()
        ids += self._plain(text[pos:])
        if self.max_length is not None:
            ids = ids[:max(0, self.max_length - len(self.prefix) - len(self.suffix))]
        return Encoding([*self.prefix, *ids, *self.suffix])

    # -- the search
    def _plain(self, text: str) -> list[int]:
        if not text:
            return []
        norm = self._pipe.normalizer.normalize_str(text) if self._pipe.normalizer else text
        words = [w for w, _ in self._pipe.pre_tokenizer.pre_tokenize_str(norm)] if self._pipe.pre_tokenizer \
            else [norm]
        out: list[int] = []
        for w in words:
            out += self._viterbi(w)
        return out

    def _viterbi(self, s: str) -> list[int]:
        n = len(s)
        score = [0.0] + [0.0] * n
        start = [-1] * (n + 1)
        tok = [0] * (n + 1)
        start[0] = 0
        get, scores, unk, longest = self.piece_id.get, self.scores, self.unk_id, self.longest.get
        for i in range(n):
            base = score[i]
            single = False
            for j in range(i + 1, min(n, i + longest(s[i], 0)) + 1):
                pid = get(s[i:j])
                if pid is None:
                    continue
                cand = base + scores[pid]
                if start[j] < 0 or cand > score[j]:
                    score[j], start[j], tok[j] = cand, i, pid
                single = single or j == i + 1
            if not single:
                cand = base + self.unk_score
                if start[i + 1] < 0 or cand > score[i + 1]:
                    score[i + 1], start[i + 1], tok[i + 1] = cand, i, unk
        pieces: list[int] = []
        unk_run: list[str] = []
        end = n
        while end > 0:
            b = start[end]
            if tok[end] == unk:
                unk_run.append(s[b:end])
            else:
                if unk_run:
                    pieces.append(get("".join(reversed(unk_run)), unk))
                    unk_run = []
                pieces.append(tok[end])
            end = b
        if unk_run:
            pieces.append(get("".join(reversed(unk_run)), unk))
        return pieces[::-1]


def _template(post: dict | None, piece_id: dict[str, int]) -> tuple[list[int], list[int]]:
    """Ids before / after the sequence in a TemplateProcessing "single" template (<s> A </s>)."""
    if not post or post.get("type") != "TemplateProcessing":
        return [], []
    pre, suf, seen = [], [], False
    for part in post["single"]:
        if "Sequence" in part:
            seen = True
            continue
        tid = part["SpecialToken"]["id"]
        ids = post["special_tokens"][tid]["ids"]
        (suf if seen else pre).extend(ids)
    return pre, suf


def is_lean_compatible(spec: dict) -> bool:
    """Unigram without byte fallback, a normaliser/pre-tokeniser tokenizers can run, a plain template."""
    m = spec.get("model") or {}
    post = spec.get("post_processor")
    return (m.get("type") == "Unigram" and not m.get("byte_fallback") and m.get("unk_id") is not None
            and (post is None or post.get("type") == "TemplateProcessing")
            and (spec.get("pre_tokenizer") or {}).get("type") == "Metaspace")


def load_tokenizer(path: str | Path):
    """The lean Unigram tokenizer where it applies, else tokenizers.Tokenizer (BERT WordPiece, BPE, …)."""
    spec = json.loads(Path(path).read_text(encoding="utf-8"))
    if os.environ.get(BACKEND_ENV, "lean") != "tokenizers" and is_lean_compatible(spec):
        return UnigramTokenizer(spec)
    from tokenizers import Tokenizer

    return Tokenizer.from_str(json.dumps(spec))
