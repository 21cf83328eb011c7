"""Failed logins slow down, then lock: per user name and per client address, counted in the database (the same
per-minute windows as the rate limits, store.api_keys.RateWindowStore), so every process of a team deployment sees
the same count.

After `DELAY_AFTER` failures within `WINDOW_MIN` minutes each further failure answers a second later (a guesser's
rate drops without a thread held for long); after `LOCK_AFTER` the user (or address) is locked — every attempt,
right or wrong, is refused with the minutes left — until the oldest failures age out of the window.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

from pipeline.errors import RateLimited
from store.api_keys import RateWindowStore

WINDOW_MIN = 15
DELAY_AFTER = 3
LOCK_AFTER = 10
DELAY_S = 1.0


class LoginThrottle:
    def __init__(self, store: RateWindowStore, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep):
        self.store, self.clock, self.sleep = store, clock, sleep

    def _buckets(self, user: str | None, address: str | None) -> list[str]:
        return [b for b in (f"login-fail:user:{user}" if user else None,
                            f"login-fail:addr:{address}" if address else None) if b]

    def check(self, user: str | None, address: str | None = None) -> None:
        """RateLimited while `user` or `address` is locked."""
        now = self.clock()
        minute = int(now // 60)
        for bucket in self._buckets(user, address):
            if self.store.total(bucket, minute - WINDOW_MIN + 1) >= LOCK_AFTER:
                first = self.store.first_minute(bucket, minute - WINDOW_MIN + 1)
                retry = max(1, math.ceil((first + WINDOW_MIN) * 60 - now))
                raise RateLimited(f"登录失败次数过多，已暂时锁定：请 {math.ceil(retry / 60)} 分钟后再试", retry)

    def failed(self, user: str | None, address: str | None = None) -> None:
        """Count one failed login; slow the answer once there were several."""
        minute = int(self.clock() // 60)
        worst = 0
        for bucket in self._buckets(user, address):
            self.store.hit(bucket, minute)
            worst = max(worst, self.store.total(bucket, minute - WINDOW_MIN + 1))
        if worst > DELAY_AFTER:
            self.sleep(DELAY_S)

    def attempt(self, check_password: Callable[[], bool], user: str | None, address: str | None = None) -> bool:
        """A login attempt: refused while locked (RateLimited), else the password check, a failure counted."""
        self.check(user, address)
        if check_password():
            return True
        self.failed(user, address)
        return False
