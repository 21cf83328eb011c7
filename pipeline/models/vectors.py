"""Small vector helpers shared by the answer path's cosine readers (gate sentence evidence, picker, support check)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np


def unit(v) -> np.ndarray:
    """float32 rows (or one vector) scaled to length 1, so a dot product is the cosine."""
    a = np.asarray(v, dtype=np.float32)
    return a / (np.linalg.norm(a, axis=-1, keepdims=True) + 1e-9)


class TextVectors:
    """Unit passage vectors of short texts (a chunk's sentences, the picker's answer windows), kept by their text
    in a bounded LRU. Embedding them is most of an offline answer's CPU (~10 texts a question, ~7 ms each on 2
    cores), and the same sentences come back: the gate's background probes, a follow-up or another user's
    question over the same chunks. The encoder runs each text alone (pipeline/models/onnx_embedding.py), so a
    kept vector is exactly what embedding the text again would give."""

    def __init__(self, embed_model: Any, cache_size: int = 30_000):
        self.embed_model = embed_model
        self.cache_size = cache_size  # 30,000 × 384 float32 ≈ 46 MB at most
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, texts: list[str]) -> np.ndarray:
        """Their unit vectors, one row per text in order: kept ones as they are, the rest embedded in one batch."""
        wanted = list(dict.fromkeys(texts))
        with self._lock:
            have = {t: self._cache[t] for t in wanted if t in self._cache}
            for t in have:
                self._cache.move_to_end(t)
        missing = [t for t in wanted if t not in have]
        if missing:
            have.update(zip(missing, unit(self.embed_model.get_text_embedding_batch(missing))))
            with self._lock:
                for t in missing:
                    self._cache[t] = have[t]
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return np.vstack([have[t] for t in texts]) if texts else np.zeros((0, 0), dtype=np.float32)
