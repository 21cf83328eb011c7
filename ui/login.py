"""The page's login (Gradio's `auth=`): the same password check as the API, behind the failed-login throttle.

Gradio's login form only knows right or wrong, so a locked user sees the wrong-password text; the lock itself
(and its minutes) is logged and said by the API (429 with the minutes left)."""
from __future__ import annotations

import logging

from pipeline.access.policy import AccessPolicy
from pipeline.errors import RateLimited
from pipeline.services.login_throttle import LOCK_AFTER, WINDOW_MIN, LoginThrottle

log = logging.getLogger(__name__)
AUTH_MESSAGE = f"请登录知识库问答（连续 {LOCK_AFTER} 次密码错误将锁定 {WINDOW_MIN} 分钟）"


def gradio_auth(policy: AccessPolicy, throttle: LoginThrottle):
    if not policy.enabled:
        return None

    def check(username: str, password: str) -> bool:
        try:
            return throttle.attempt(lambda: policy.check(username, password), username)
        except RateLimited as exc:
            log.warning("page login of %r refused: %s", username, exc.msg)
            return False

    return check
