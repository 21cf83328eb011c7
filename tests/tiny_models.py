"""Tiny random BERT models built at test time (no package carries bge / a cross-encoder).

Both load through the same code paths as real local models:
  * ``make_tiny_bert_embedding(dir)``  -> sentence-transformers folder (mean pooling, normalize);
    loads with ``HuggingFaceEmbedding(model_name=dir)`` / ``pipeline.models.embeddings.load_embedding``.
  * ``make_tiny_cross_encoder(dir)``   -> BertForSequenceClassification (num_labels=1);
    loads with ``SentenceTransformerRerank(model=str(dir))``.
Building takes well under a second. Weights are random (seeded): use them for plumbing, not quality.
"""
from __future__ import annotations

import json
from pathlib import Path

TINY_DIM = 32
_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Common Chinese characters, ASCII letters and digits, so test texts are mostly not [UNK].
_CHARS = ("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说"
          "产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点"
          "从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又"
          "么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入"
          "常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西"
          "被干做必战先回则任取据处理世车长江河海湖中国北京上海城市公司模型检索文档问答向量")
_ASCII = list("abcdefghijklmnopqrstuvwxyz0123456789") + list(".,!?;:()-'\"/%")


def _vocab() -> list[str]:
    seen: list[str] = []
    for tok in _SPECIALS + list(dict.fromkeys(_CHARS)) + _ASCII + ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"]:
        if tok not in seen:
            seen.append(tok)
    return seen


def _bert_config(vocab_size: int, **extra):
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab_size, hidden_size=TINY_DIM, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=128, type_vocab_size=2, **extra)


def _write_tokenizer(out: Path) -> None:
    from transformers import BertTokenizerFast

    (out / "vocab.txt").write_text("\n".join(_vocab()) + "\n", encoding="utf-8")
    # from_pretrained(dir): on transformers 5, BertTokenizerFast(vocab_file=...) yields a 5-token vocab.
    tok = BertTokenizerFast.from_pretrained(str(out))
    assert tok.vocab_size == len(_vocab()), tok.vocab_size
    tok.model_max_length = 128
    tok.save_pretrained(str(out))


def make_tiny_bert_embedding(dir: Path) -> Path:
    """A 2-layer, 32-d random BERT as a sentence-transformers folder (mean pooling + normalize)."""
    import torch
    from transformers import BertModel

    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_tokenizer(out)
    torch.manual_seed(0)
    BertModel(_bert_config(len(_vocab()))).save_pretrained(str(out))
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ], indent=2), encoding="utf-8")
    (out / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 128, "do_lower_case": False}), encoding="utf-8")
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": TINY_DIM, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}), encoding="utf-8")
    (out / "2_Normalize").mkdir(exist_ok=True)
    return out


def make_tiny_cross_encoder(dir: Path) -> Path:
    """A 2-layer random BertForSequenceClassification (num_labels=1): a cross-encoder reranker."""
    import torch
    from transformers import BertForSequenceClassification

    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_tokenizer(out)
    torch.manual_seed(0)
    # A wider init than BERT's 0.02 so random scores differ visibly between passages.
    cfg = _bert_config(len(_vocab()), num_labels=1, initializer_range=0.3)
    BertForSequenceClassification(cfg).save_pretrained(str(out))
    return out
