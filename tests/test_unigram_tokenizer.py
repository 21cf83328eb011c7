"""The lean Unigram tokenizer (pipeline/models/unigram_tokenizer.py) gives exactly the ids `tokenizers` gives:
a hand-made vocabulary with ties and unknown characters (ids worked out by hand), then the packaged e5's real
tokenizer.json on real documents from ../shared/docs (used in place) and a dev set's passages and questions."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from pipeline.models.unigram_tokenizer import UnigramTokenizer, load_tokenizer
from tests.shared_data import DATA, DOCS, NOVEL, needs

ROOT = Path(__file__).resolve().parents[1]
E5_TOKENIZER = ROOT / "models" / "multilingual-e5-small" / "tokenizer.json"

# ids: 0 <s>, 1 <pad>, 2 </s>, 3 <unk>, then pieces
PIECES = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0),
          ("▁", -1.0), ("刘", -3.0), ("备", -3.0), ("刘备", -5.0), ("三", -2.0), ("顾", -2.0), ("三顾", -4.0),
          ("▁刘", -2.5), ("ab", -1.0), ("a", -0.5), ("b", -0.5)]


def _tiny_spec() -> dict:
    tok = Tokenizer(models.Unigram(PIECES, unk_id=3, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(" {2,}", " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>"])
    return json.loads(tok.to_str())


def test_hand_made_vocabulary_exact_ids():
    spec = _tiny_spec()
    lean, ref = UnigramTokenizer(spec), Tokenizer.from_str(json.dumps(spec))
    # 「刘备三顾」 is one word ▁刘备三顾. Best path scores by end position: ▁ −1, ▁刘 −2.5; 刘备 from ▁ gives −6 but
    # 备 after ▁刘 gives −5.5; 三顾 then ends at −9.5, and 三 + 顾 reaches the same −9.5 later: a tie keeps the
    # first → ▁刘 备 三顾 = 11, 6, 10.
    assert lean.encode("刘备三顾").ids == [0, 11, 6, 10, 2]
    # 「ab夏夏a」: ab (−1) and a + b (−1) tie → ab; 夏 has no piece → <unk> scored min(−5) − 10 each, the two
    # fused into one <unk>; then a → ▁ ab <unk> a = 4, 12, 3, 13.
    assert lean.encode("ab夏夏a").ids == [0, 4, 12, 3, 13, 2]
    for text in ("刘备三顾", "ab夏夏a", "  刘  备 <s> ab </s>", "", "ａｂ", "夏"):
        assert lean.encode(text).ids == ref.encode(text).ids, text
    lean.enable_truncation(4)
    ref.enable_truncation(max_length=4)
    assert lean.encode("abab刘备").ids == ref.encode("abab刘备").ids == [0, 4, 12, 2]


def test_other_tokenizers_are_left_to_tokenizers(tmp_path):
    from tests.tiny_models import make_tiny_bert_embedding

    d = make_tiny_bert_embedding(tmp_path / "bert")
    assert isinstance(load_tokenizer(d / "tokenizer.json"), Tokenizer)  # WordPiece: not ours
    assert isinstance(load_tokenizer(E5_TOKENIZER), UnigramTokenizer)


def _texts() -> list[str]:
    out = ["刘备三顾茅庐请的是谁？", "passage: Hello  world, <mask> x <s>y</s> ＜unk＞ 😀 𠀀 ﬁ ①② \t\n end",
           "query: " + "长" * 3000, "", "   "]
    novel = NOVEL.read_bytes().decode("gb18030", errors="replace")
    out += ["passage: " + novel[i:i + 300] for i in range(0, 150_000, 300)]
    out += ["passage: " + p.read_text(encoding="utf-8")[:3000] for p in sorted((DOCS / "chatchat").glob("*.md"))]
    squad = json.loads((DATA / "cmrc2018" / "cmrc2018_trial.json").read_text(encoding="utf-8"))
    for art in squad["data"]:
        for para in art["paragraphs"]:
            out.append("passage: " + para["context"])
            out += ["query: " + qa["question"] for qa in para["qas"]]
    return out


@pytest.mark.skipif(not E5_TOKENIZER.exists(), reason=f"{E5_TOKENIZER} not built yet (built on first start)")
@needs(NOVEL, DOCS / "chatchat", DATA / "cmrc2018" / "cmrc2018_trial.json")
@pytest.mark.slow
def test_packaged_e5_ids_identical_on_real_text():
    ref = Tokenizer.from_file(str(E5_TOKENIZER))
    lean = load_tokenizer(E5_TOKENIZER)
    for t in (ref, lean):
        t.no_padding()
        t.enable_truncation(max_length=512)
    texts = _texts()
    assert len(texts) > 1000
    want = [e.ids for e in ref.encode_batch(texts)]
    got = [e.ids for e in lean.encode_batch(texts)]
    diff = [t[:60] for t, a, b in zip(texts, want, got) if a != b]
    assert not diff, diff[:5]
    assert lean.token_to_id("<pad>") == ref.token_to_id("<pad>") == 1
