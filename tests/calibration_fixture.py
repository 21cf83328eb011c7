"""A small dev-data root in the layout of ../shared/data, for tools.calibrate on a tiny model (tests only).

Three of the dev sets of tools/kb_cache.DEV_SETS, generated from templates (seeded): two SQuAD-format sets
(xquad_zh: companies, cmrc_trial: rivers) and a DuReader-format one (dureader_dev: how-to questions over search
results) — different topics, so each set's questions are out of the other sets' knowledge bases, as in the real
sets. A few dozen question/passage pairs each; read through the repo's own loaders (tools.evaluate).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from tests.tiny_models import _CHARS

SETS = ("xquad_zh", "cmrc_trial", "dureader_dev")
_POOL = [c for c in dict.fromkeys(_CHARS) if c not in "的了和是在有不这也就都而及与或"]


def _names(rnd: random.Random, n: int, size: int) -> list[str]:
    seen: list[str] = []
    while len(seen) < n:
        name = "".join(rnd.sample(_POOL, size))
        if name not in seen:
            seen.append(name)
    return seen


def _squad(paragraphs: list[tuple[str, list[tuple[str, str]]]]) -> dict:
    return {"data": [{"title": f"t{i}", "paragraphs": [{"context": ctx, "qas": [
        {"id": f"{i}-{j}", "question": q, "answers": [{"text": a, "answer_start": ctx.index(a)}]}
        for j, (q, a) in enumerate(qas)]}]} for i, (ctx, qas) in enumerate(paragraphs)]}


def companies(rnd: random.Random, n: int) -> dict:
    out = []
    for name, city, product in zip(_names(rnd, n, 2), _names(rnd, n, 2), _names(rnd, n, 2)):
        year, staff = rnd.randint(1950, 2020), rnd.randint(20, 900) * 10
        ctx = (f"{name}公司成立于{year}年，总部位于{city}市。公司主要生产{product}机，员工约{staff}人。"
               f"{name}公司的产品销往全国各地，也出口到海外。")
        out.append((ctx, [(f"{name}公司成立于哪一年？", f"{year}年"), (f"{name}公司的总部在哪里？", f"{city}市")]))
    return _squad(out)


def rivers(rnd: random.Random, n: int) -> dict:
    out = []
    for river, source, sea in zip(_names(rnd, n, 2), _names(rnd, n, 2), _names(rnd, n, 2)):
        km = rnd.randint(100, 6000)
        ctx = (f"{river}河发源于{source}山，全长约{km}公里，向东流经多个城市，最后注入{sea}海。"
               f"{river}河两岸的平原是重要的农业区。")
        out.append((ctx, [(f"{river}河最后注入哪里？", f"{sea}海"), (f"{river}河全长多少公里？", f"{km}公里")]))
    return _squad(out)


def how_to(rnd: random.Random, n: int) -> list[dict]:
    out = []
    for thing, tool, other in zip(_names(rnd, n, 2), _names(rnd, n, 2), _names(rnd, n, 2)):
        answer = f"先把{thing}放进水里，再用{tool}轻轻处理，最后放在通风的地方晾干"
        docs = [{"paragraphs": [f"{thing}怎么清洗？{answer}。", f"很多人问{thing}的问题，网上说法不一。"],
                 "most_related_para": 0},
                {"paragraphs": [f"{other}和{thing}不同，{other}需要专门的方法。"], "most_related_para": 0}]
        out.append({"question": f"{thing}怎么清洗", "documents": docs, "answer_docs": [0], "fake_answers": [answer]})
    return out


def write_dev_data(root: Path, n: int = 24, seed: int = 5) -> Path:
    """The three sets under `root` at their DEV_SETS paths; returns `root` (for $KBQA_SHARED_DATA)."""
    from tools.eval.devsets import DEV_SETS

    rnd = random.Random(seed)
    for name, content in (("xquad_zh", companies(rnd, n)), ("cmrc_trial", rivers(rnd, n))):
        path = root / DEV_SETS[name].path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content, ensure_ascii=False), encoding="utf-8")
    path = root / DEV_SETS["dureader_dev"].path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in how_to(rnd, n)) + "\n", encoding="utf-8")
    return root
