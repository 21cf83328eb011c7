"""Background work yields to the questions computing in its process (pipeline/retrieval/in_flight.py): the ingest
waits before its embedding work while a question computes — bounded, so it never starves — and a wait ends as soon
as the last question does."""
from __future__ import annotations

import threading
import time

from pipeline.components import INGEST_YIELD_MAX_S
from pipeline.retrieval.in_flight import QuestionsInFlight
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle
from tests.waiting import wait_until

TEXT = "员工请假须提前三天提交申请，经部门负责人批准后方可休假。病假须附医院证明。" * 4


def test_a_wait_ends_when_the_last_question_ends_and_is_bounded_otherwise():
    q = QuestionsInFlight()
    assert not q.busy() and q.wait_idle(0)
    started, ended = threading.Event(), threading.Event()
    result: list[bool] = []

    def waiter():
        started.set()
        result.append(q.wait_idle(60))
        ended.set()

    with q.computing():
        with q.computing():
            assert q.busy()
            t0 = time.monotonic()
            assert not q.wait_idle(0.2)  # bounded: False after the timeout
            assert time.monotonic() - t0 >= 0.2
            threading.Thread(target=waiter, daemon=True).start()
            started.wait(5)
        assert not ended.wait(0.1)  # one question still computes
    assert ended.wait(10) and result == [True]  # woken by the last one, long before its 60 s
    assert not q.busy()


def test_ingest_waits_for_a_question_computing_then_goes_on(tmp_path):
    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"))
    try:
        questions = engine.components.questions
        a, b = tmp_path / "a.txt", tmp_path / "b.txt"
        a.write_text(TEXT, encoding="utf-8")
        b.write_text(TEXT.replace("员工", "职工"), encoding="utf-8")
        with questions.computing():  # a question computing the whole time
            t0 = time.monotonic()
            assert engine.upload([(a.name, a)])[0].ok
            wait_idle(engine)
            held = time.monotonic() - t0
        # it waited (bounded) before its one embedding batch, and still finished
        assert held >= INGEST_YIELD_MAX_S * 0.95
        assert engine.get_document(engine.list_documents()["items"][0]["doc_id"])["status"] == "ready"
        t0 = time.monotonic()
        assert engine.upload([(b.name, b)])[0].ok  # no question: no wait
        wait_idle(engine)
        assert time.monotonic() - t0 < held
    finally:
        engine.close()


def test_background_threads_run_at_a_lower_priority_and_questions_do_not(tmp_path):
    """Linux keeps nice per thread: the ingest worker runs BACKGROUND_NICE lower than the thread that answers,
    and the answering thread keeps its priority."""
    import os

    from pipeline.retrieval.in_flight import BACKGROUND_NICE

    mine = os.getpriority(os.PRIO_PROCESS, 0)
    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"))
    try:
        worker = next(t for t in threading.enumerate() if t.name == "ingest-worker")
        wait_until(lambda: os.getpriority(os.PRIO_PROCESS, worker.native_id) == min(19, mine + BACKGROUND_NICE),
                   10, 0.01, "the ingest worker to lower its priority")
        engine.search("请假", 5)
        assert os.getpriority(os.PRIO_PROCESS, 0) == mine
    finally:
        engine.close()
