"""Requests per minute per API key and per login user, counted in the database (store.api_keys.RateWindowStore).

Fixed one-minute windows by the wall clock: one upsert per request adds to the row of (bucket, minute) that
every app process of a team deployment shares. Over the limit: RateLimited with the seconds left in the window
(HTTP 429 + Retry-After). Old windows are pruned now and then by whichever process counts.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

from pipeline.errors import RateLimited
from store.api_keys import RateWindowStore

PRUNE_EVERY_S = 300.0
KEEP_MINUTES = 15  # the table also holds failed logins, counted over 15 minutes (pipeline/services/login_throttle)


class RateLimiter:
    def __init__(self, store: RateWindowStore, default_limit: Callable[[], int],
                 login_limit: Callable[[], int] = lambda: 0, clock: Callable[[], float] = time.time):
        self.store = store
        self.default_limit = default_limit  # keys: the setting api_rate_limit_per_min
        self.login_limit = login_limit      # logins: the setting login_rate_limit_per_min
        self.clock = clock
        self._pruned = 0.0

    def check_key(self, key_id: int, limit: int | None) -> None:
        self.check(f"key:{key_id}", limit)

    def check_login(self, user: str) -> None:
        self.check(f"user:{user}", self.login_limit())

    def check(self, bucket: str, limit: int | None = None) -> None:
        """Count one request of `bucket`; RateLimited when it is over `limit` (None: the setting; 0: no limit)."""
        limit = self.default_limit() if limit is None else limit
        if not limit:
            return
        now = self.clock()
        minute = int(now // 60)
        if now - self._pruned > PRUNE_EVERY_S:
            self._pruned = now
            self.store.prune(minute - KEEP_MINUTES)
        if self.store.hit(bucket, minute) > limit:
            retry = max(1, math.ceil((minute + 1) * 60 - now))
            raise RateLimited(f"请求过于频繁：每分钟最多 {limit} 次，请 {retry} 秒后重试", retry)
