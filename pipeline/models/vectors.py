"""Small vector helpers shared by the answer path's cosine readers (gate sentence evidence, picker, support check)."""
from __future__ import annotations

import numpy as np


def unit(v) -> np.ndarray:
    """float32 rows (or one vector) scaled to length 1, so a dot product is the cosine."""
    a = np.asarray(v, dtype=np.float32)
    return a / (np.linalg.norm(a, axis=-1, keepdims=True) + 1e-9)
