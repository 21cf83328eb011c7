"""The last retrievals by question, so 重试 regenerates an answer without retrieving again."""
from __future__ import annotations

import threading
from collections import OrderedDict

from pipeline.retrieval.result import RetrievalResult


class RecentRetrievals:
    def __init__(self, capacity: int = 64):
        self.capacity = capacity
        self._items: "OrderedDict[str, RetrievalResult]" = OrderedDict()
        self._lock = threading.Lock()

    def get(self, question: str) -> RetrievalResult | None:
        with self._lock:
            return self._items.get(question)

    def put(self, question: str, res: RetrievalResult) -> None:
        with self._lock:
            self._items[question] = res
            self._items.move_to_end(question)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def clear(self) -> None:
        """After a delete or rebuild: cached retrievals may hold chunks that are gone."""
        with self._lock:
            self._items.clear()
