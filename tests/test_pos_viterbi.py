"""The part-of-speech HMM search on numpy gives jieba's own result, to the bit, on real text."""
from __future__ import annotations

import json
import random
import re
import unicodedata

import jieba.posseg as pseg
from jieba.posseg.viterbi import viterbi as jieba_viterbi

from pipeline.models.pos_viterbi import jieba_pos_viterbi
from pipeline.models.tokenize_zh import ChineseTokenizer
from tests.shared_data import DATA, RULES, needs

XQUAD = DATA / "xquad" / "xquad.zh.json"
_HAN = re.compile("[\u4E00-\u9FD5]+")


def _sentences() -> list[str]:
    """Encyclopedic paragraphs (transliterated names: what the HMM search is for) and a regulation."""
    data = json.loads(XQUAD.read_text(encoding="utf-8"))
    texts = [p["context"] for a in data["data"] for p in a["paragraphs"]][::12]
    texts.append(RULES.read_text(encoding="utf-8")[:6000])
    return [s for t in texts for s in re.split(r"[。！？\n]", t) if s.strip()]


@needs(XQUAD, RULES)
def test_the_search_equals_jiebas_on_real_and_shuffled_runs():
    runs = [m.group(0) for s in _sentences() for m in _HAN.finditer(s)]
    pool = "".join(runs)
    rnd = random.Random(7)  # character soups: states the real runs may never reach, ties, dead ends
    runs += ["".join(rnd.choice(pool) for _ in range(rnd.randint(1, 16))) for _ in range(200)]
    runs += ["乂", "𠀀𠀀", "的的的的的的的的", "阿卜杜勒·阿齐兹"]
    fast = jieba_pos_viterbi()
    differ = [r for r in runs if fast.viterbi(r) != jieba_viterbi(r, pseg.char_state_tab_P, pseg.start_P,
                                                                   pseg.trans_P, pseg.emit_P)]
    assert len(runs) > 800 and differ == []


@needs(XQUAD, RULES)
def test_the_tokenizer_tags_as_jieba_posseg_does():
    tok = ChineseTokenizer()
    sentences = _sentences()[:400]
    ours = [tok.tagged(s) for s in sentences]
    theirs = [[(w.word, w.flag) for w in pseg.lcut(unicodedata.normalize("NFKC", s))] for s in sentences]
    assert ours == theirs
    assert any(flag == "nr" for tags in ours for _, flag in tags)  # names found by the HMM search are in there
