"""tools/eval/keyword_terms_study.py: the keyword route's term schemes, on a knowledge base small enough to read."""
from pipeline.models.tokenize_zh import ChineseTokenizer
from tools.eval.keyword_terms_study import (
    SCHEMES,
    Chunk,
    bigrams,
    index_terms,
    load_chunks,
    metrics,
    query_terms,
    ranks,
)

TEXTS = [
    # the deciding clause: 「申请延期」 is a phrase here, jieba cuts it into words any text may hold
    "纳税人因有特殊困难，不能按期缴纳税款的，可以申请延期缴纳税款，税务机关应当自收到报告之日起20日内作出决定",
    # the neighbour holds the same words apart and is shorter
    "纳税人可以依照法律的规定书面申请减税、免税；展览活动延期举办的，主办单位应当向税务机关报告",
    "企业应当为职工缴纳工伤保险费",
    "住房公积金的缴存比例不低于百分之五",
]


class Question:
    def __init__(self, text, gold):
        self.text, self.gold = text, gold


def _chunks(tok):
    return [Chunk(i, t, t, tok.tokenize(t)) for i, t in enumerate(TEXTS)]


def test_bigrams_run_inside_chinese_text_only():
    assert bigrams("申请延期，20日内；ok") == ["申请", "请延", "延期", "日内"]
    assert bigrams("a") == [] and bigrams("税") == []


def test_the_schemes_index_and_ask_what_they_say():
    tok = ChineseTokenizer()
    c = _chunks(tok)[0]
    assert index_terms("words", c) == c.words
    assert index_terms("both", c) == c.words + bigrams(c.indexed)
    assert all(t.startswith("#") for t in index_terms("both_apart", c)[len(c.words):])
    assert "请延" in query_terms("ask_bigrams", ["申请", "延期"], "申请延期", lambda w: True)
    # only the bigrams of words the index lacks
    assert query_terms("ask_unseen", ["申请", "交税"], "申请交税", lambda w: w != "交税") == ["申请", "交税", "交税"]


def test_a_phrase_cut_into_common_words_is_found_by_its_bigrams():
    tok = ChineseTokenizer()
    q = Question("申请延期交税，税务局多少天内给答复？", 0)
    got = {s: ranks(_chunks(tok), [q], lambda q, c: c.doc_id == q.gold, s, tok.tokenize)[0] for s in SCHEMES}
    assert got["words"] == 2 and got["ask_bigrams"] == 2  # the shorter neighbour first
    assert got["both"] == 1 and got["bigrams"] == 1 and got["both_apart"] == 1
    assert ranks(_chunks(tok), [Question("红烧肉怎么做", 0)], lambda q, c: True, "both", tok.tokenize) == [None]


def test_metrics_count_a_miss_as_zero():
    m = metrics([1, 2, None, 11])
    assert m == {"mrr@10": round((1 + 0.5) / 4, 4), "hit@1": 0.25, "recall@50": 0.75, "n": 4}


def test_chunks_are_read_as_a_knowledge_base_holds_them(tmp_path):
    """On the app's own schema (a database its migrations made, rows written by its store): only ready, active
    documents' enabled chunks; the context line is indexed, the text judged."""
    from sqlalchemy import text as sql

    from store.db import Database
    from store.documents import ChunkRow, DocumentStore

    db = Database(tmp_path / "app.db")
    docs = DocumentStore(db)

    def doc(name: str, texts: list[tuple[str, str | None]], ready: bool = True) -> list[int]:
        d = docs.create(name, "txt", 1, name.ljust(32, "0"), name)["doc_id"]
        ids = docs.replace_chunks(d, [ChunkRow(d, i, t, None, 0, len(t), "text", [t], ctx)
                                      for i, (t, ctx) in enumerate(texts)])
        if ready:
            docs.mark_ready(d, len(texts))
        return ids

    _, off = doc("a", [("第一条 正文", "《条例》"), ("停用", None)])
    doc("b", [("未完成", None)], ready=False)
    doc("c", [("旧版", None)])
    with db.transaction() as conn:
        conn.execute(sql("UPDATE kb_chunk SET enabled = 0 WHERE chunk_id = :c"), {"c": off})
        conn.execute(sql("UPDATE kb_document SET active = 0 WHERE file_name = 'c'"))
    db.close()
    got = load_chunks(tmp_path)
    assert [(c.text, c.indexed, c.words) for c in got] == [("第一条 正文", "《条例》\n第一条 正文", ["第一条 正文"])]
