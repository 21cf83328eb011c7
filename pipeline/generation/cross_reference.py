"""A figure a rule leaves to another article of the same document: 「开户单位支付给个人的款项，超过使用现金限额的部分，
应当以支票或者银行本票支付」 with 「前款使用现金限额，按本条例第五条第二款的规定执行」 beside it — the figure asked
(「多少以上就不能给现金了？」) is 第五条's 「前款结算起点定为1000元」.

A regulation names its own articles as 「本条例第五条」 (本法 / 本办法 / 本规定 / 本细则 …). When the articles an answer
quotes hold no figure of the kind asked but refer so to another article, and that article is among the sources (a
chunk of the same document), its sentences that hold such a figure are the answer. Read in the sources only: what
the answer quotes must be a source it cites. Lexical; nothing here embeds.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pipeline.generation.answer_type import offers, untagged
from pipeline.generation.articles import NUMERALS, articles_of, citation
from pipeline.generation.candidates import Candidate
from pipeline.generation.sentences import answer_units, is_statement
from pipeline.retrieval.nodes import node_meta, node_text

# 「本条例第五条」「本法第二十二条第二款」: an article of the document itself (a bare 「第五条」 may be another law's,
# 「依照《…》第十二条」)
OWN_ARTICLE = re.compile(rf"本(?:条例|法|办法|规定|细则|实施细则|决定|章程|合同|协议)第([{NUMERALS}\d]+)条")


def referred_articles(texts: Sequence[str]) -> list[str]:
    """The document's own articles these texts refer to (「第五条」), in order, each once."""
    out: list[str] = []
    for text in texts:
        for m in OWN_ARTICLE.finditer(text):
            article = f"第{m.group(1)}条"
            if article not in out:
                out.append(article)
    return out


def referred_figure(kind: str, question: str, quoted: Sequence[Candidate], nodes: Sequence[Any]) -> list[Candidate]:
    """The sentences of the sources that hold a figure of the kind asked in an article of the same document the
    quoted sentences refer to, with their citation; [] when there is none."""
    refs = referred_articles([c.piece.text for c in quoted])
    docs = {c.doc for c in quoted if c.doc is not None}
    if not refs or not docs:
        return []
    out: list[Candidate] = []
    seen = {"".join(c.piece.text.split()) for c in quoted}
    for source, n in enumerate(nodes, start=1):
        meta, text = node_meta(n), node_text(n)
        if meta.get("doc_id") not in docs:
            continue
        pieces = answer_units(text)
        articles = articles_of(text, pieces)
        for p in pieces:
            key = "".join(p.text.split())
            if (articles.get(p.position) in refs and key not in seen and is_statement(p)
                    and offers(kind, p.text, question, untagged)):
                seen.add(key)
                out.append(Candidate(p, source, 0.0, 0.0, doc=meta.get("doc_id"), formal=True,
                                     cite=citation(meta.get("doc_name"), articles[p.position])))
    return out
