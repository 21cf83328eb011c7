"""Failed logins slow down, then lock — per user and per address, counted in the database (a second process on the
same database sees the lock); the API says so with 429 + Retry-After, the page's login refuses while locked."""
from __future__ import annotations

import base64

import pytest

from pipeline.access.policy import AccessPolicy
from pipeline.errors import RateLimited
from pipeline.services.login_throttle import DELAY_AFTER, LOCK_AFTER, WINDOW_MIN, LoginThrottle
from store.api_keys import RateWindowStore
from store.db import Database
from tests.live import LiveApp
from tests.tiny_engine import tiny_engine, tiny_model
from ui.login import gradio_auth

POLICY = AccessPolicy.from_args(["alice:a-pw", "bob:b-pw"])


def basic(user: str, pw: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()}


class Clock:
    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_the_api_slows_then_locks_and_says_so(tmp_path):
    live = LiveApp(tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny")), POLICY, owns_engine=True)
    throttle = live.engine.login_throttle
    slept: list[float] = []
    throttle.sleep, throttle.clock = slept.append, Clock()  # components of the throttle: no real waiting
    try:
        with live.http() as http:
            def kbs(user, pw):
                return http.get("/api/kbs", headers=basic(user, pw))

            assert kbs("alice", "a-pw").status_code == 200
            for i in range(LOCK_AFTER):
                r = kbs("alice", f"wrong-{i}")
                assert r.status_code == 401 and r.json()["code"] == 4001
            assert len(slept) == LOCK_AFTER - DELAY_AFTER  # the answers after the first few came a second late
            locked = kbs("alice", "a-pw")  # the right password too, while locked
            assert locked.status_code == 429 and "锁定" in locked.json()["msg"]
            assert 0 < int(locked.headers["Retry-After"]) <= WINDOW_MIN * 60
            # the address is locked as well: another user from it waits too
            assert kbs("bob", "b-pw").status_code == 429
            throttle.clock.t += WINDOW_MIN * 60 + 1  # the failures age out of the window
            assert kbs("alice", "a-pw").status_code == 200
    finally:
        live.stop()


def test_a_lock_is_seen_by_another_process_and_by_the_page_login(tmp_path):
    one, two = Database(tmp_path / "app.db"), Database(tmp_path / "app.db")
    try:
        clock = Clock()
        a, b = LoginThrottle(RateWindowStore(one), clock, lambda s: None), LoginThrottle(RateWindowStore(two), clock,
                                                                                        lambda s: None)
        for _ in range(LOCK_AFTER):
            assert a.attempt(lambda: False, "carol", "10.0.0.1") is False
        with pytest.raises(RateLimited):
            b.check("carol")  # counted in the database: the other process sees it
        b.check("dave", "10.0.0.2")  # someone else, elsewhere: free
        page = gradio_auth(AccessPolicy.from_args(["carol:c-pw"]), b)
        assert page("carol", "c-pw") is False  # the page's login refuses while locked
        clock.t += WINDOW_MIN * 60 + 1
        assert page("carol", "c-pw") is True
    finally:
        one.close()
        two.close()
