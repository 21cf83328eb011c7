"""Follow-up rewriting: the deterministic rewrite (examples, chains, standalone CMRC questions untouched) and the
LLM rewrite against the scripted OpenAI-compatible server (plumbing, timeout and fall-backs)."""
from __future__ import annotations

import time

import pytest

from pipeline.conversation.rewrite import DeterministicRewriter, LLMRewriter, Rewrite, previous_docs, previous_query
from tests.test_router import cmrc_questions


@pytest.fixture(scope="module")
def rules():
    return DeterministicRewriter()


def turn(q, rewritten=None, answer="", route="LIGHT"):
    return {"question": q, "rewritten": rewritten, "answer": answer, "route": route}


@pytest.mark.parametrize("prev,follow,expected,kind", [
    ("采购合同里甲方的违约责任是什么？", "那乙方呢？", "采购合同里乙方的违约责任是什么？", "marker"),
    ("行政诉讼监督规则第五条规定了哪些可以申请监督的情形？", "第七条呢？", "行政诉讼监督规则第七条", "ellipsis"),
    ("星河智能手表有什么功能", "它的价格是多少", "星河智能手表的价格是多少", "pronoun"),
    ("什么是角色提示技术？", "那种子词提示呢？", "什么是种子词提示技术？", "marker"),
    ("零样本提示是什么", "那少样本提示呢", "少样本提示是什么", "marker"),
    ("星河会员积分怎么用", "怎么申请？", "星河会员积分 怎么申请", "no_topic"),
    ("星河电子的客服电话是多少？", "服务时间呢？", "星河电子的客服电话 服务时间", "ellipsis"),
    ("当事人申请行政诉讼监督的期限是多久？", "这个期间可以延长吗？", "当事人申请行政诉讼监督的期限 期间可以延长吗",
     "pronoun"),
])
def test_follow_ups_are_completed_from_the_previous_turn(rules, prev, follow, expected, kind):
    r = rules.rewrite(follow, [turn(prev)])
    assert (r.query, r.kind, r.method) == (expected, kind, "deterministic")
    assert r.changed and r.original == follow and r.note


@pytest.mark.parametrize("prev,follow,expected", [
    # 「具体」 shares 体 with 「体育馆」, but no word: the previous topic is kept and the follow-up's words added
    ("收费的体育馆对老人学生有优惠吗？", "那具体怎么优惠是谁定的？", "收费的体育馆对老人学生 具体怎么优惠是谁定的"),
    ("工会委员会中工会主席的工作职责是什么？", "宣传委员呢？", "工会委员会中工会主席的工作职责 宣传委员"),
    # 「日子才交」 holds an adverb: a clause of its own, not a term for the 「时候交」 of 「什么时候交」 (which gave
    # 「…最晚什么日子才交？ 过」)
    ("上半年的矿产资源补偿费最晚什么时候交？", "过了日子才交呢？", "上半年的矿产资源补偿费最晚 过了日子才交"),
])
def test_a_parallel_phrase_swaps_whole_words_only(rules, prev, follow, expected):
    r = rules.rewrite(follow, [turn(prev)])
    assert r.query == expected and "替换" not in r.note, r


@pytest.mark.parametrize("prev,follow,kind", [
    # 上面 with no noun before it: on the thing just talked about (the report)
    ("个人征信报告一年能免费查几次？", "要是发现上面有错的记录，多久能给我处理？", "locative"),
    # a one-character verb opening the question with no object before 的时候 / 的话 / 以后: the last question's object
    ("病人在医院去世了，家属觉得死因有问题，要多久内做尸检？", "做的时候家属能派人在旁边看吗？", "elided"),
    ("新造一条渔船，什么时候要去报检验？", "验完以后几天能拿到证？", "elided"),
    # the act just talked about, not done: a one-character verb under 不 / 没 and no noun after it
    ("村口河边想开个渡口方便大家过河，要找谁批？", "没批就先开起来了会怎样？", "negated"),
    ("养殖场的猪一下子成批病死，第一时间该报告给谁？", "我要是不报呢？会怎么样？", "negated"),
])
def test_an_object_left_out_is_completed_with_the_whole_last_question(rules, prev, follow, kind):
    r = rules.rewrite(follow, [turn(prev)])
    assert r.kind == kind and r.follows_up and r.query.startswith(prev.rstrip("？").replace("，", " ")), r
    assert r.query.endswith(follow.rstrip("？").rstrip("吗").replace("，", "").replace("？", "")), r


@pytest.mark.parametrize("question", ["不交社保会怎样？", "没有连接到州际高速公路的最大的城市是哪个？",
                                      "不结丁髷而放开头发的风潮在什么时候开始盛行？", "不能按时交怎么办？"])
def test_a_negated_act_with_its_own_matter_is_no_follow_up(rules, question):
    assert rules.rewrite(question, [turn("工厂的排污许可证管几年？")]).kind != "negated"


@pytest.mark.parametrize("question", ["石碑上面写了什么？", "打鱼的时候网里捞上来一只江豚，该怎么处理？",
                                      "抢救的时候来不及写病历，事后多长时间内要补上？"])
def test_a_place_or_a_verb_with_its_own_object_is_no_follow_up(rules, question):
    assert rules.rewrite(question, [turn("工厂的排污许可证管几年？")]).kind is None


@pytest.mark.parametrize("prev,follow", [
    ("工厂的排污许可证管几年？", "快到期了还要接着排，怎么办？"),
    ("当兵两年退伍了，选择自己找工作，要在多少天内去报到？", "去报到要带些什么？"),
])
def test_a_question_naming_no_subject_is_marked_but_left_as_typed(rules, prev, follow):
    r = rules.rewrite(follow, [turn(prev)])
    assert (r.query, r.kind, r.method, r.changed) == (follow, "no_subject", "none", False) and r.tentative
    assert r.follows_up and r.note
    # searched again within the cited documents only after an outright refusal, not to replace weak evidence
    assert r.searches_cited_after(hit=False, weak=False)
    assert not r.searches_cited_after(hit=True, weak=True) and not r.searches_cited_after(hit=True, weak=False)
    assert rules.rewrite(follow, []).kind is None  # nothing before it to lean on


def test_a_follow_up_the_rules_flag_is_searched_again_after_weak_evidence_too(rules):
    r = rules.rewrite("那乙方呢？", [turn("采购合同里甲方的违约责任是什么？")])
    assert not r.tentative and r.searches_cited_after(hit=True, weak=True) and r.searches_cited_after(False, False)
    assert not r.searches_cited_after(hit=True, weak=False)
    standalone = rules.rewrite("结婚登记要去哪里办理？", [turn("采购合同里甲方的违约责任是什么？")])
    assert standalone.kind is None and not standalone.searches_cited_after(hit=False, weak=False)


@pytest.mark.parametrize("question", [
    "排污许可证快到期了怎么办？", "于乐在哪里出身？", "做的时候家属能派人在旁边看吗？", "第十六条规定了什么",
    "iPhone 怎么截图", "2019年的产量是多少", "什么是窃听？", "要是发现上面有错的记录，多久能给我处理？",
])
def test_a_question_that_names_something_has_a_subject(rules, question):
    assert not rules.names_no_subject(question)


def test_standalone_questions_are_left_alone(rules):
    for prev, q in [("采购合同里甲方的违约责任是什么？", "采购合同一式几份？"),
                    ("第五条规定了什么", "什么是窃听？"), ("甲方违约责任", "那不勒斯在哪个国家？"),
                    ("x", "为什么天空是蓝色的呢？")]:
        r = rules.rewrite(q, [turn(prev)])
        assert not r.changed and r.method == "none", (q, r)
    assert not rules.rewrite("那乙方呢？", []).changed  # nothing to resolve against


def test_100_cmrc_standalone_questions_are_unchanged(rules):
    """Each of 100 CMRC dev questions asked right after the previous one. Questions that open with a pronoun or
    demonstrative (「他…」「该频道…」) lean on their passage by construction and are not standalone: they are
    counted apart (and rewritten), the rest must come back verbatim."""
    qs = cmrc_questions(130)
    standalone, anaphoric = [], []
    for prev, q in zip(qs, qs[1:]):
        (anaphoric if rules.follow_up_kind(q) == "pronoun" else standalone).append((prev, q))
    standalone = standalone[:100]
    assert len(standalone) == 100
    changed = [(p, q, rules.rewrite(q, [turn(p)]).query) for p, q in standalone
               if rules.rewrite(q, [turn(p)]).changed]
    assert changed == []
    assert all(rules.rewrite(q, [turn(p)]).kind == "pronoun" for p, q in anaphoric)


def test_chain_carries_the_topic_and_skips_chitchat_turns(rules):
    history = [turn("行政诉讼监督规则第十五条说的是什么？")]
    r2 = rules.rewrite("第十六条呢？", history)
    assert r2.query == "行政诉讼监督规则第十六条"
    history.append(turn("第十六条呢？", r2.query))
    history.append(turn("谢谢", None, "不客气", route="DIRECT"))
    assert previous_query(history) == "行政诉讼监督规则第十六条"
    assert rules.rewrite("第十七条呢？", history).query == "行政诉讼监督规则第十七条"


def test_previous_docs_are_the_cited_documents_of_the_last_knowledge_turn():
    def src(doc, cited):
        return {"doc_id": doc, "cited": cited}
    cited = {**turn("甲方的违约责任？"), "source_docs": [src(3, False), src(7, True), src(5, True), src(7, True)]}
    uncited = {**turn("乙方呢？"), "source_docs": [src(4, False), src(4, False), src(9, False)]}
    chat = {**turn("谢谢", None, "不客气", route="DIRECT"), "source_docs": []}
    assert previous_docs([cited]) == [7, 5]  # cited ones, in source order, once each
    assert previous_docs([cited, uncited]) == [4, 9]  # none cited (a weak answer): all its sources' documents
    assert previous_docs([cited, chat]) == [7, 5]  # chit-chat carries no documents
    assert previous_docs([uncited, {**turn("问"), "source_docs": []}]) == []  # the last answer was a refusal
    assert previous_docs([turn("客户端自带的历史")]) == [] and previous_docs([]) == []


def test_follows_up_is_the_rules_flag_or_a_changed_llm_rewrite():
    assert Rewrite("采购合同里乙方的违约责任", "那乙方呢？", "deterministic", "marker").follows_up
    assert not Rewrite("采购合同一式几份？", "采购合同一式几份？", "none").follows_up
    assert Rewrite("采购合同的质保期", "质保期呢？", "llm").follows_up
    assert not Rewrite("采购合同一式几份？", "采购合同一式几份？", "llm").follows_up
    assert Rewrite("采购合同里乙方", "那乙方呢？", "llm_fallback", "marker").follows_up


# --- the LLM rewrite --------------------------------------------------------------------------------
def llm_for(server, timeout=5.0):
    from pipeline.generation.llm_client import build_llm
    from pipeline.settings import Settings

    return build_llm(Settings(llm_api_url=server.base_url, llm_model="fake-model", llm_api_key="k",
                              llm_timeout=timeout))


HIST = [turn("采购合同里甲方的违约责任是什么？", answer="甲方无正当理由拒收货物的，应偿付违约金[1]。")]


def test_llm_rewrite_uses_history_and_its_answer(fake_llm, rules):
    fake_llm.reply = "改写后的问题：采购合同里乙方的违约责任是什么？"
    r = LLMRewriter(llm_for(fake_llm), rules).rewrite("那乙方呢？", HIST)
    assert (r.query, r.method) == ("采购合同里乙方的违约责任是什么？", "llm")
    body = fake_llm.chat_requests[-1]["body"]
    assert body.get("stream") in (None, False) and body["temperature"] == 0.0
    prompt = body["messages"][-1]["content"]
    assert "用户：采购合同里甲方的违约责任是什么？" in prompt and "助手：甲方无正当理由拒收货物" in prompt
    assert "用户最后的问题：\n<question>\n那乙方呢？\n</question>" in prompt


@pytest.mark.parametrize("mode,reply,why", [
    ("error", None, "大模型改写失败"),
    ("normal", "   ", "大模型改写为空"),
    ("normal", "今天天气不错，我们去公园散步吧。", "丢失了问题中的关键词"),
    ("normal", "乙方" * 200, "过长"),
    ("normal", "用户最后的问题：那乙方呢？", "未补全追问"),  # the prompt echoed back, unchanged
])
def test_llm_rewrite_falls_back_to_the_rules(fake_llm, rules, mode, reply, why):
    fake_llm.mode = mode
    if reply is not None:
        fake_llm.reply = reply
    r = LLMRewriter(llm_for(fake_llm), rules).rewrite("那乙方呢？", HIST)
    assert r.method == "llm_fallback" and why in r.note
    assert r.query == "采购合同里乙方的违约责任是什么？"  # the deterministic rewrite


def test_llm_rewrite_of_a_standalone_question_may_stay_unchanged(fake_llm, rules):
    fake_llm.reply = "用户：采购合同一式几份？"
    r = LLMRewriter(llm_for(fake_llm), rules).rewrite("采购合同一式几份？", HIST)
    assert (r.query, r.method) == ("采购合同一式几份？", "llm")


def test_llm_rewrite_timeout_falls_back_in_time(fake_llm, rules):
    fake_llm.mode = "slow"
    fake_llm.slow_seconds = 10
    t0 = time.monotonic()
    r = LLMRewriter(llm_for(fake_llm, timeout=30), rules, timeout_s=1.0).rewrite("那乙方呢？", HIST)
    assert time.monotonic() - t0 < 3
    assert r.method == "llm_fallback" and r.query == "采购合同里乙方的违约责任是什么？"


def test_llm_rewrite_not_called_without_history(fake_llm, rules):
    r = LLMRewriter(llm_for(fake_llm), rules).rewrite("采购合同一式几份？", [])
    assert r.method == "none" and fake_llm.chat_requests == []
