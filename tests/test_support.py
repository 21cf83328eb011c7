"""Citation support check: claims are parsed from the answer, judged against every source, and a scripted LLM that
cites the wrong source on purpose gets its citation marked — in `done`, in `sources[i].support`, in the trace count,
over real HTTP (SSE and sync) against the launched app, and in the chat's rendering.
"""
from __future__ import annotations

import pytest

from pipeline.generation.support import SupportChecker, SupportParams, claims
from tests.live import LiveApp, engine_with_texts
from tests.test_api import sse_events
from ui.history import messages
from ui.render import answer_markdown, render_sources, render_trace

DOCS = {
    "售后政策.txt": "本公司商品支持七天无理由退货，退货期限为 7 天，自签收之日起计算。退货运费由买家承担。"
                 "换货需保持商品包装完好，配件齐全，换货期限为 15 天。",
    "员工手册.txt": "员工每年享有带薪年假十天，入职满五年后增加到十五天。请假需提前三个工作日在系统中提交申请。",
    "设备说明.txt": "打印机卡纸时，先关闭电源，打开前盖，沿出纸方向轻轻取出纸张，再重新开机。",
}
QUESTION = "退货期限是几天？运费谁承担？"


def test_claims_are_the_sentences_that_cite():
    got = claims("退货期限为 7 天[1]。运费由买家承担[1][3]。\n- 另见说明书。换货期限为 15 天。[2]")
    assert got == [("退货期限为 7 天。", [1]), ("运费由买家承担。", [1, 3]), ("换货期限为 15 天。", [2])]
    assert claims("没有引用的回答。") == []
    md = answer_markdown("换货期限为 15 天。[2]", support=[{"text": "换货期限为 15 天。", "unsupported": [2]}])
    assert "kb-cite-unsupported" in md


def test_judge_marks_the_wrong_citation_not_the_right_one():
    p = SupportParams(w_cos=10, w_cov=1, w_phrase=1, floor=9.5, margin=0.5, hard_floor=8.0)
    chk = SupportChecker(None, None, params=p)
    assert chk.judge({1: 10.6, 2: 9.0, 3: 8.2}, [1]) == ([], None)
    assert chk.judge({1: 10.6, 2: 9.0, 3: 8.2}, [2]) == ([2], 1)  # another source backs it clearly better
    assert chk.judge({1: 9.2, 2: 9.0, 3: 8.2}, [2]) == ([], 1)    # below the floor, but nothing is clearly better
    assert chk.judge({1: 7.5, 2: 7.6}, [1]) == ([1], 2)           # below the hard floor: unsupported on its own
    assert chk.judge({1: 10.6, 2: 9.0}, [1, 2]) == ([2], None)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    app = LiveApp(engine_with_texts(tmp_path_factory.mktemp("support"), DOCS))
    yield app
    app.stop(close_engine=True)


@pytest.mark.slow
def test_wrong_citation_marked_end_to_end(live, fake_llm):
    with live.http() as http:
        r = http.put("/api/config", json={"llm": {"llm_api_url": fake_llm.base_url, "llm_model": "fake-model",
                                                  "llm_api_key": "sk-test-0001"}}).json()
        assert r["code"] == 0
        assert http.post("/api/config/reload").json()["code"] == 0
        # which number each document gets for this question (the same retrieval the answer will use)
        final = live.engine.retrieve(QUESTION).final
        numbers = {n.node.metadata["doc_name"]: i for i, n in enumerate(final, 1)}
        right, wrong = numbers["售后政策.txt"], numbers["员工手册.txt"]
        # the scripted model: the first sentence cites the right source, the second the wrong one on purpose
        fake_llm.reply = f"退货期限为签收后 7 天[{right}]。退货运费由买家承担[{wrong}]。"
        with http.stream("POST", "/api/qa/ask", json={"question": QUESTION}) as resp:
            events = sse_events(resp)
        done = next(d for e, d in events if e == "done")
        sources = next(d for e, d in events if e == "sources")["sources"]
        assert done["mode"] == "llm"
        first, second = done["support"]
        assert first["cited"] == [right] and first["supported"] and first["unsupported"] == []
        assert second["cited"] == [wrong] and not second["supported"] and second["unsupported"] == [wrong]
        assert second["better_source"] == right
        assert done["support_summary"] == {"checked": 2, "unsupported": 1}
        by_no = {s["no"]: s for s in sources}
        assert by_no[right]["support"]["supported"] is True and by_no[right]["cited"]
        assert by_no[wrong]["support"]["supported"] is False
        assert by_no[wrong]["support"]["score"] < by_no[right]["support"]["score"]
        assert all(by_no[n]["support"] is None for n in by_no if n not in (right, wrong))
        # the sync form carries the same marks, and the trace counts them (检索过程)
        sync = http.post("/api/qa/ask/sync", json={"question": QUESTION}).json()["data"]
        assert sync["trace"]["support"] == {"checked": 2, "unsupported": 1}
        assert [s["supported"] for s in sync["support"]] == [True, False]
        # the chat renders the mark on the wrong citation only
        answer = "".join(d["text"] for e, d in events if e == "delta")
        md = answer_markdown(answer, support=done["support"])
        assert md.count("kb-cite-unsupported") == 1 and f'data-cite="{wrong}" data-supported="false"' in md
        assert "⚠ 引用与内容不符" in render_sources(sources)
        trace = dict(next(d for e, d in events if e == "trace"), support=done["support_summary"])
        assert "1 处与所引来源不符" in render_trace(trace)
        # reloaded from the server (another browser, after a restart): the stored turn replays the marks
        conv = http.get(f"/api/conversations/{done['conversation_id']}").json()["data"]
        stored = conv["turns"][-1]
        assert stored["trace"]["support"] == {"checked": 2, "unsupported": 1}
        assert [s["unsupported"] for s in stored["trace"]["support_sentences"]] == [[], [wrong]]
        replay = messages(conv["turns"], active=len(conv["turns"]) - 1)[-1]["content"]
        assert replay.count("kb-cite-unsupported") == 1 and f'data-cite="{wrong}" data-supported="false"' in replay
        assert "1 处与所引来源不符" in render_trace(stored["trace"])
        # a correct answer: nothing marked
        fake_llm.reply = f"退货期限为签收后 7 天[{right}]。"
        ok = http.post("/api/qa/ask/sync", json={"question": QUESTION + "请简答"}).json()["data"]
        assert ok["trace"]["support"] == {"checked": 1, "unsupported": 0}
