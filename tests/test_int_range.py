"""Issue 27 (smaller): ids or page numbers ≥ 2^63 in REST paths and queries are a 4xx envelope error — 3002 for
an id that cannot exist, 1001 for a query parameter — never HTTP 500 (the 64-bit database integer overflowed)."""
from __future__ import annotations

import pytest

BIG = str(2**63)
HUGE = str(2**64 + 5)


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    from tests.live import LiveApp
    from tests.tiny_engine import tiny_engine, tiny_model

    tmp = tmp_path_factory.mktemp("ints")
    live = LiveApp(tiny_engine(tmp / "data", tiny_model(tmp / "tiny")))
    try:
        with live.http() as client:
            r = client.post("/api/kb/documents", files=[("file", ("小.txt", "星河电子的客服电话是 400-800-1234。".encode()))])
            assert r.json()["data"][0]["ok"]
            assert live.engine.wait_idle(120)
            yield client
    finally:
        live.stop(close_engine=True)


@pytest.mark.parametrize("method,url", [
    ("GET", f"/api/kb/documents/{BIG}/chunks"),
    ("GET", f"/api/kb/documents/{HUGE}/text"),
    ("GET", f"/api/kb/documents/{BIG}/file"),
    ("GET", f"/api/kb/documents/{BIG}/page"),
    ("GET", f"/api/kb/documents/{BIG}/versions"),
    ("POST", f"/api/kb/documents/{BIG}/restore"),
    ("DELETE", f"/api/kb/documents/{BIG}"),
    ("GET", f"/api/kbs/{BIG}"),
    ("DELETE", f"/api/verified/{BIG}"),
])
def test_huge_path_id_is_no_such_object(http, method, url):
    r = http.request(method, url)
    assert r.status_code == 404, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == 3002 and "不存在" in body["msg"], body


@pytest.mark.parametrize("url", [
    f"/api/kb/documents?page={BIG}",
    f"/api/kb/documents?size=10&kb_id={HUGE}",
    f"/api/kb/documents/1/text?part={BIG}",
    f"/api/kb/documents/1/text?chunk_id={BIG}",
    f"/api/kb/documents/1/page?page={BIG}",
    f"/api/kb/documents/1/page?page=1&chunk_id=-{HUGE}",
])
def test_huge_query_number_is_a_validation_error(http, url):
    r = http.get(url)
    assert r.status_code == 400, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == 1001 and "超出范围" in body["msg"], body


def test_in_range_but_absurd_numbers_are_not_500(http):
    for url in ("/api/kb/documents?page=9223372036854775807", f"/api/kb/documents/{2**63 - 1}/chunks",
                "/api/kb/documents/1/text?part=9223372036854775807"):
        r = http.get(url)
        assert r.status_code < 500, (url, r.status_code, r.text)


def test_normal_requests_pass(http):
    items = http.get("/api/kb/documents").json()["data"]["items"]
    doc_id = items[0]["doc_id"]
    assert http.get(f"/api/kb/documents/{doc_id}/chunks").json()["code"] == 0
    assert http.get("/api/kb/documents", params={"keyword": BIG}).json()["code"] == 0  # a string parameter


@pytest.mark.parametrize("url,body", [
    ("/api/feedback", {"turn_id": 2**63, "rating": 1}),
    ("/api/verified", {"question": "问题？", "answer": "答案。", "feedback_id": 2**64}),
])
def test_huge_ids_in_json_bodies_are_not_500(http, url, body):
    r = http.post(url, json=body)
    assert 400 <= r.status_code < 500 and r.json()["code"] in (1001, 3002), (r.status_code, r.text)
