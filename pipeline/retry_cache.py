"""The last retrievals by (conversation, question), so 重试 regenerates an answer without retrieving again.

The value is (the query rewrite, the RetrievalResult): a retried follow-up keeps the query it was answered
with (an LLM rewrite asked again could differ).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any


class RecentRetrievals:
    def __init__(self, capacity: int = 64):
        self.capacity = capacity
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        with self._lock:
            return self._items.get(key)

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def clear(self) -> None:
        """After a delete or rebuild: cached retrievals may hold chunks that are gone."""
        with self._lock:
            self._items.clear()
