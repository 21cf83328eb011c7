"""The query-adapter study's arithmetic (tools/eval/adapter_study.py): the route metrics of W = 0 are today's
ranking, and the fit learns a map that a synthetic task needs (questions that are a fixed rotation of their
passage's vector)."""
from __future__ import annotations

import numpy as np

from tools.eval import adapter_study
from tools.eval.adapter_study import SetVecs


def _unit(m: np.ndarray) -> np.ndarray:
    return (m / np.linalg.norm(m, axis=1, keepdims=True)).astype(np.float32)


def _rotation(d: int = 16) -> np.ndarray:
    """A fixed rotation (the Cayley transform of a random skew matrix): far enough from the identity that the raw
    cosine ranks few questions' passages first."""
    a = np.random.default_rng(42).normal(size=(d, d))
    a = 0.5 * (a - a.T) / 2
    return (np.eye(d) - a) @ np.linalg.inv(np.eye(d) + a)


def _rotated_set(seed: int, n: int = 120, d: int = 16) -> SetVecs:
    """Passage i answers question i; each question is its passage's vector turned by one fixed rotation, so the raw
    cosine ranks it poorly and one linear map restores it."""
    rng = np.random.default_rng(seed)
    c = _unit(rng.normal(size=(n, d)))
    q = _unit(c @ _rotation(d).T + 0.05 * rng.normal(size=(n, d)))
    return SetVecs("rot", q, c, [np.array([i]) for i in range(n)], np.arange(n), [{i} for i in range(n)])


def test_route_metrics_rank_by_the_raw_cosine_when_w_is_none():
    c = _unit(np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]], dtype=np.float32))
    q = _unit(np.array([[1, 0.1, 0], [0, 0, 1]], dtype=np.float32))
    # question 0's gold is passage 3 (second by cosine), question 1's is passage 2 (first)
    s = SetVecs("t", q, c, [np.array([3]), np.array([2])], np.array([0, 1, 2, 3]), [{3}, {2}])
    m = adapter_study.route_metrics(s, None)
    assert m["n"] == 2
    assert m["mrr"] == (0.5 + 1.0) / 2
    assert m["h1"] == 0.5
    assert m["doc1"] == 0.5
    assert adapter_study.route_metrics(s, np.zeros((3, 3), np.float32)) == m


def test_the_fit_learns_the_map_the_questions_need():
    train, test = _rotated_set(seed=0), _rotated_set(seed=1)  # new passages and questions, the same rotation
    before = adapter_study.route_metrics(test, None)
    w = adapter_study.fit([adapter_study.training_batch(train)], None, 1e-4, 16)
    after = adapter_study.route_metrics(test, w)
    assert before["h1"] < 0.1
    assert after["h1"] > 0.5
    assert after["mrr"] > before["mrr"] + 0.5
