"""The load benchmark's own test: a few seconds against a live app on 127.0.0.1, successes and failures."""
from __future__ import annotations

import json

import pytest

from tests.live import LiveApp
from tests.shared_data import RULES, needs
from tests.tiny_engine import real_paragraphs, tiny_engine, tiny_model, wait_idle
from tools.bench import bench_load

pytestmark = needs(RULES)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("load")
    engine = tiny_engine(tmp / "data", tiny_model(tmp / "tiny"))
    engine.upload([(RULES.name, RULES)])
    wait_idle(engine)
    app = LiveApp(engine)
    app.tmp = tmp
    yield app
    app.stop(close_engine=True)


def test_a_few_seconds_of_load_all_succeed(live, capsys):
    qfile = live.tmp / "questions.txt"
    qfile.write_text("\n".join(p[:40] for p in real_paragraphs()[:6]) + "\n\n", encoding="utf-8")
    out = live.tmp / "load.json"
    rc = bench_load.main(["--concurrency", "3", "--questions", str(qfile), "--duration", "3", "--url", live.url,
                          "--json", str(out)])
    assert rc == 0, capsys.readouterr().out
    r = json.loads(out.read_text(encoding="utf-8"))
    assert r["requests"] >= 3 and r["successes"] == r["requests"] and r["failures_by_code"] == {}
    assert 0 < r["first_event_s"]["p50"] <= r["done_s"]["p50"] <= r["done_s"]["p99"]
    assert r["throughput_per_s"] > 0 and r["wall_s"] >= 3
    assert "成功" in capsys.readouterr().out


def test_each_question_once_and_failures_counted_by_code_without_retry(live, capsys):
    qfile = live.tmp / "mixed.json"
    questions = ["人民检察院的监督职责", "长" * 2500, "行政诉讼的受理"]  # the middle one is refused (1001)
    qfile.write_text(json.dumps(questions, ensure_ascii=False), encoding="utf-8")
    before = live.engine.retrieval_calls
    out = live.tmp / "mixed-out.json"
    rc = bench_load.main(["--concurrency", "2", "--questions", str(qfile), "--url", live.url, "--json", str(out)])
    r = json.loads(out.read_text(encoding="utf-8"))
    assert rc == 1
    assert (r["requests"], r["successes"], r["failures"]) == (3, 2, 1)
    assert r["failures_by_code"] == {"http_400_1001": 1}
    assert live.engine.retrieval_calls - before == 2  # the refused one was not retried
    assert "http_400_1001: 1" in capsys.readouterr().out


def test_engine_errors_in_the_stream_and_a_dead_server_are_failures(live, tmp_path):
    qfile = tmp_path / "q.txt"
    qfile.write_text("行政诉讼\n", encoding="utf-8")
    live.engine.state = "reloading"  # what a reload looks like to a client: 2002 inside the stream
    try:
        r = bench_load.run(live.url, ["行政诉讼"], 1, None, 30)
    finally:
        live.engine.state = "ready"
    assert r["failures_by_code"] == {"2002": 1}
    assert bench_load.main(["--concurrency", "1", "--questions", str(qfile), "--url", "http://127.0.0.1:9"]) == 1
    assert bench_load.run("http://127.0.0.1:9", ["x"], 1, None, 5)["failures_by_code"] == {"connect": 1}
