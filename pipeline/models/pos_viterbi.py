"""jieba.posseg's HMM Viterbi (the part-of-speech search over runs of characters the dictionary lacks), on numpy.

Why: jieba's own loop takes, for every character, the max over every (previous state, state) pair in a Python
generator — ~5,000 additions per character over its 256 (position, tag) states. The extractive picker tags up to
ten sentences per question (pipeline/generation/answer_type.py), and on names the dictionary lacks that was
~120 ms of pure Python per question, holding the GIL (more than the rest of the question together). Here each
character is one (previous × next) array operation.

The result is jieba's to the bit: the same float additions in the same order ((V + trans) + emit), the same
candidate sets per character (its `prev_states`, `obs_states` rules and fall-backs), and the same tie-breaks —
jieba takes max over (prob, state) tuples, so among equal probabilities the greatest state wins; states are
indexed in sorted order and the LAST maximum is taken. tests/test_pos_viterbi.py compares both on real text.
"""
from __future__ import annotations

import threading

import numpy as np

MIN_FLOAT = -3.14e100  # jieba.posseg.viterbi's score of a character a state never emits


class PosViterbi:
    """viterbi(obs) → (prob, route): what jieba.posseg.viterbi.viterbi(obs, char_state_tab_P, start_P, trans_P,
    emit_P) returns, for the model tables given."""

    def __init__(self, char_states: dict, start_p: dict, trans_p: dict, emit_p: dict):
        self.states = sorted(trans_p)  # ascending: the last of equal maxima is jieba's tuple max
        self.index = {s: i for i, s in enumerate(self.states)}
        n = len(self.states)
        self.trans = np.full((n, n), -np.inf)
        self.follows = np.zeros((n, n), dtype=bool)  # y0 → y is one of trans_p[y0]'s keys
        for y0, row in trans_p.items():
            for y, p in row.items():
                self.trans[self.index[y0], self.index[y]] = p
                self.follows[self.index[y0], self.index[y]] = True
        self.has_next = self.follows.any(axis=1)
        self.start = np.array([start_p[s] for s in self.states])
        self._emit_p = emit_p
        self._char_states = char_states
        self._all = np.arange(n)
        self._emit: dict[str, np.ndarray] = {}  # character → emission scores of every state (filled as met)
        self._allowed: dict[str, np.ndarray] = {}  # character → mask of the states it may take
        self._lock = threading.Lock()

    def _emission(self, ch: str) -> np.ndarray:
        row = self._emit.get(ch)
        if row is None:
            row = np.array([self._emit_p[s].get(ch, MIN_FLOAT) for s in self.states])
            with self._lock:
                self._emit[ch] = row
        return row

    def _allowed_mask(self, ch: str) -> np.ndarray | None:
        """The states jieba's char_state_tab allows for `ch`; None: every state (a character it does not list)."""
        if ch not in self._char_states:
            return None
        mask = self._allowed.get(ch)
        if mask is None:
            mask = np.zeros(len(self.states), dtype=bool)
            mask[[self.index[s] for s in self._char_states[ch]]] = True
            with self._lock:
                self._allowed[ch] = mask
        return mask

    def viterbi(self, obs: str) -> tuple[float, list]:
        first = self._allowed_mask(obs[0])
        present = self._all if first is None else np.flatnonzero(first)  # the states reached, ascending
        v = self.start[present] + self._emission(obs[0])[present]  # their scores, aligned with `present`
        back: list[tuple[np.ndarray, np.ndarray]] = []  # per step: the states reached, their best predecessor
        for ch in obs[1:]:
            keep = self.has_next[present]
            prev, v_prev = present[keep], v[keep]
            expect = self.follows[prev].any(axis=0)
            allowed = self._allowed_mask(ch)
            reached = np.flatnonzero(expect if allowed is None else allowed & expect)
            if not len(reached):
                reached = np.flatnonzero(expect) if expect.any() else self._all
            scores = (v_prev[:, None] + self.trans[prev[:, None], reached]) + self._emission(ch)[reached]
            last = len(prev) - 1 - np.argmax(scores[::-1], axis=0)  # the last maximum: the greatest state
            v = scores[last, np.arange(len(reached))]
            back.append((reached, prev[last]))
            present = reached
        at = len(present) - 1 - int(np.argmax(v[::-1]))
        prob, state = float(v[at]), int(present[at])
        route = [None] * len(obs)
        for i in range(len(obs) - 1, -1, -1):
            route[i] = self.states[state]
            if i:
                reached, pred = back[i - 1]
                state = int(pred[np.searchsorted(reached, state)])
        return prob, route


def pos_tokenizer(tokenizer, word_tag_tab: dict):
    """A jieba.posseg.POSTokenizer over `tokenizer` (a jieba.Tokenizer) whose HMM search is PosViterbi.

    jieba calls its search from one private method (`POSTokenizer.__cut`, name-mangled to `_POSTokenizer__cut`);
    the subclass overrides just that, with jieba's own body around the faster search. Everything else — the
    dictionary route, the user dictionary's tags, the blocks handed to the search — stays jieba's."""
    import jieba.posseg as pseg

    search = jieba_pos_viterbi()

    class _FastPOSTokenizer(pseg.POSTokenizer):
        def _POSTokenizer__cut(self, sentence):
            _prob, pos_list = search.viterbi(sentence)
            begin, nexti = 0, 0
            for i, char in enumerate(sentence):
                pos = pos_list[i][0]
                if pos == "B":
                    begin = i
                elif pos == "E":
                    yield pseg.pair(sentence[begin:i + 1], pos_list[i][1])
                    nexti = i + 1
                elif pos == "S":
                    yield pseg.pair(char, pos_list[i][1])
                    nexti = i + 1
            if nexti < len(sentence):
                yield pseg.pair(sentence[nexti:], pos_list[nexti][1])

    pos = _FastPOSTokenizer.__new__(_FastPOSTokenizer)  # POSTokenizer.__init__ = these two attributes
    pos.tokenizer = tokenizer
    pos.word_tag_tab = word_tag_tab
    return pos


_shared: PosViterbi | None = None
_shared_lock = threading.Lock()


def jieba_pos_viterbi() -> PosViterbi:
    """The one PosViterbi over jieba.posseg's bundled model (its tables are read once per process)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            import jieba.posseg as pseg

            _shared = PosViterbi(pseg.char_state_tab_P, pseg.start_P, pseg.trans_P, pseg.emit_P)
        return _shared
