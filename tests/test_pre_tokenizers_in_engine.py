"""Every pre-tokenizer the converter recognises, judged by the engine and by HF `tokenizers`.

For each ``tokenizer.ggml.pre`` name in the converter's table, a tiny DeepSeek checkpoint
(tests/fixtures/v2_greedy or v3_noaux, its embedding and output resized to the vocabulary)
gets a tokenizer.json whose pre_tokenizer is the one published with that family's models,
and whose vocabulary and merges are the real ones from the pinned llama.cpp's
``models/ggml-vocab-<name>.gguf`` (V3, which has no such file there, keeps the fixture's
own 400-token vocabulary). The whole checkpoint is converted, the model is **loaded by the
engine** (not vocab-only), and its token ids must equal

* llama.cpp's own expected ids for that vocabulary (``ggml-vocab-<name>.gguf.inp/.out``, made
  upstream from the HF tokenizers), and
* HF `tokenizers` on the same tokenizer.json, over the tokenizer corpus.

The check is the engine accepting and tokenizing the file, not our label table: a label the
engine does not know fails the load here (as "gpt2" for GPT-2's pre-tokenizer once did).
"""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from conftest import fixture_dir, llama_cpp_source_dir
from test_tokenizer import CORPUS, KNOWN_V2_DIVERGENCE, _format_mismatches, fuzz_corpus

tokenizers = pytest.importorskip("tokenizers", reason="HF `tokenizers` (the test extra) is the judge here")
gguf = pytest.importorskip("gguf")

from deepseek_cpu.converters import tokenizer as tk  # noqa: E402

LLAMA_SRC = llama_cpp_source_dir()


def _split(regex: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


_BYTELEVEL_AFTER_SPLITS = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


def _fixture_pre_tokenizer(fixture: str) -> dict:
    # the fixtures carry DeepSeek's published pre_tokenizer verbatim (tests/fixtures/README.md)
    return json.loads((fixture_dir(fixture) / "tokenizer.json").read_text(encoding="utf-8"))["pre_tokenizer"]


# name -> (tiny checkpoint to convert, the pre_tokenizer as published in that family's
# tokenizer.json, the vocabulary file in llama.cpp's models/ or None for the fixture's own)
# Llama 3's tokenizer.json also says "ignore_merges": true (see IGNORES_MERGES).
PUBLISHED = {
    # DeepSeek-LLM / V2 / V2-Lite / V2.5 (deepseek-ai/DeepSeek-V2's tokenizer.json)
    "deepseek-llm": ("v2_greedy", lambda: _fixture_pre_tokenizer("v2_greedy"), "deepseek-llm"),
    # DeepSeek-V3 / R1 (deepseek-ai/DeepSeek-V3's tokenizer.json)
    "deepseek-v3": ("v3_noaux", lambda: _fixture_pre_tokenizer("v3_noaux"), None),
    # deepseek-ai/deepseek-coder-* and DeepSeek-Coder-V2-Lite
    "deepseek-coder": ("v2_greedy", lambda: {"type": "Sequence", "pretokenizers": [
        _split("[\r\n]"), _split("\\s?\\p{L}+"), _split("\\s?\\p{P}+"),
        _split("[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"),
        {"type": "Digits", "individual_digits": True}, _BYTELEVEL_AFTER_SPLITS]}, "deepseek-coder"),
    # openai-community/gpt2: the ByteLevel step splits with its built-in regex
    "gpt-2": ("v2_greedy", lambda: {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                     "use_regex": True}, "gpt-2"),
    # meta-llama/Meta-Llama-3-8B (the R1 Llama distills)
    "llama-bpe": ("v2_greedy", lambda: {"type": "Sequence", "pretokenizers": [_split(
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
        "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"), _BYTELEVEL_AFTER_SPLITS]}, "llama-bpe"),
}

# published tokenizer.json files whose BPE model has "ignore_merges": true
IGNORES_MERGES = {"llama-bpe"}

# texts where the engine's regex for a pre-tokenizer is known to split differently from
# HF's; engine issues, not conversion ones (see test_tokenizer.KNOWN_V2_DIVERGENCE)
KNOWN_DIVERGENCE = {"deepseek-llm": KNOWN_V2_DIVERGENCE}


def test_every_recognised_pre_tokenizer_has_an_engine_test():
    assert set(PUBLISHED) == set(tk.KNOWN_PRE_TOKENIZERS)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_ignore_merges_must_agree_with_the_engine(name):
    """A tokenizer.json whose ignore_merges flag differs from what the engine does for its
    pre-tokenizer is refused (the engine would tokenize it differently from HF)."""
    published = PUBLISHED[name][1]()
    good = {"model": {"type": "BPE", "ignore_merges": name in IGNORES_MERGES}, "pre_tokenizer": published}
    assert tk.detect_pre_tokenizer(good) == name
    bad = {"model": {"type": "BPE", "ignore_merges": name not in IGNORES_MERGES}, "pre_tokenizer": published}
    with pytest.raises(tk.UnsupportedTokenizer, match="ignore_merges"):
        tk.detect_pre_tokenizer(bad)


def _vocab_file(name: str) -> Path:
    if LLAMA_SRC is None:
        pytest.fail("the pinned llama.cpp source (its models/ folder) was not found: build the package first "
                    "or set DEEPSEEK_CPU_LLAMA_SRC")
    path = LLAMA_SRC / "models" / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        pytest.fail(f"{path} is missing from the pinned llama.cpp source")
    return path


def _tokenizer_json_from_vocab_gguf(path: Path, pre_tokenizer: dict, ignore_merges: bool) -> tuple[dict, dict]:
    """tokenizer.json + tokenizer_config.json holding a GGUF vocabulary's tokens and merges."""
    r = gguf.GGUFReader(path)
    f = r.fields
    tokens = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    merges = f["tokenizer.ggml.merges"].contents()
    T = gguf.TokenType
    vocab = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == T.NORMAL}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": ty != T.CONTROL, "special": ty == T.CONTROL}
             for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (T.CONTROL, T.USER_DEFINED)]
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
          "pre_tokenizer": pre_tokenizer, "post_processor": None,
          "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                    "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges}}
    cfg = {"add_bos_token": False, "add_eos_token": False}
    for kind in ("bos", "eos"):
        key = f"tokenizer.ggml.{kind}_token_id"
        if key in f:
            cfg[f"{kind}_token"] = tokens[int(f[key].contents())]
    return tj, cfg


def _read_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]]) -> None:
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def _checkpoint_with_vocab(fixture: str, dest: Path, n_vocab: int, tj: dict, tok_cfg: dict) -> Path:
    """A copy of a fixture checkpoint whose embedding and output have n_vocab rows (seeded
    random bf16) and whose tokenizer files are the given ones."""
    src = fixture_dir(fixture)
    dest.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    index = json.loads((src / "model.safetensors.index.json").read_text())
    rng = np.random.default_rng(0)
    resized = {}
    weight_map = dict(index["weight_map"])
    for shard in sorted(set(weight_map.values())):
        header, data = _read_safetensors(src / shard)
        kept = {}
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            a, b = meta["data_offsets"]
            if name in ("model.embed_tokens.weight", "lm_head.weight"):
                rows = (rng.standard_normal((n_vocab, meta["shape"][1]), dtype=np.float32) * 0.02)
                bf16 = (rows.view(np.uint32) >> 16).astype(np.uint16)
                resized[name] = ("BF16", (n_vocab, meta["shape"][1]), bf16.tobytes())
                weight_map[name] = "model-vocab.safetensors"
            else:
                kept[name] = (meta["dtype"], tuple(meta["shape"]), data[a:b])
        _write_safetensors(dest / shard, kept)
    _write_safetensors(dest / "model-vocab.safetensors", resized)
    index["weight_map"] = weight_map
    (dest / "model.safetensors.index.json").write_text(json.dumps(index))
    by_text = {a["content"]: a["id"] for a in tj["added_tokens"]}
    cfg.update(vocab_size=n_vocab, bos_token_id=by_text.get(tok_cfg.get("bos_token")),
               eos_token_id=by_text.get(tok_cfg.get("eos_token")))
    (dest / "config.json").write_text(json.dumps(cfg))
    (dest / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    (dest / "tokenizer_config.json").write_text(json.dumps(tok_cfg, ensure_ascii=False), encoding="utf-8")
    return dest


@pytest.fixture(scope="module", params=sorted(PUBLISHED))
def converted_pre(request, tmp_path_factory):
    """(name, HF tokenizer, engine Llama over the converted full model, vocab file or None,
    the converted GGUF)."""
    from deepseek_cpu import Llama
    from deepseek_cpu.conversion.convert import convert
    name = request.param
    fixture, published, vocab_name = PUBLISHED[name]
    tmp = tmp_path_factory.mktemp(f"pre-{name}")
    if vocab_name is None:
        src = fixture_dir(fixture)
        tj = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
        tj["pre_tokenizer"] = published()
        ckpt = tmp / "ckpt"
        shutil.copytree(src, ckpt)
        (ckpt / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
        vocab_file = None
    else:
        vocab_file = _vocab_file(vocab_name)
        tj, tok_cfg = _tokenizer_json_from_vocab_gguf(vocab_file, published(), name in IGNORES_MERGES)
        n_vocab = len(gguf.GGUFReader(vocab_file).fields["tokenizer.ggml.tokens"].data)
        ckpt = _checkpoint_with_vocab(fixture, tmp / "ckpt", n_vocab, tj, tok_cfg)
    out = convert(ckpt, tmp / f"{name}.gguf", outtype="f32", progress=False)
    # the engine is the judge: it must accept the label and build its tokenizer from it
    # logits_all: without it llama-cpp-python 0.3.36 never writes `scores` (np.ndarray, uninitialized)
    llm = Llama(str(out), n_ctx=64, n_threads=2, logits_all=True, verbose=False)
    hf = tokenizers.Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    yield name, hf, llm, vocab_file, out
    llm.close()


def _engine_ids(llm, text: str, special: bool) -> list[int]:
    return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=special))


def test_engine_reads_the_label_as_written(converted_pre):
    name, _, llm, _, _ = converted_pre
    assert llm.metadata["tokenizer.ggml.pre"] == name
    assert llm.metadata["tokenizer.ggml.model"] == tk.TOKENIZER_MODEL
    # the loaded model is usable end to end: one evaluated token gives finite logits
    llm.reset()
    ids = _engine_ids(llm, "Hello", special=False)
    llm.eval(ids)
    logits = np.asarray(llm.scores[: len(ids)])
    assert np.isfinite(logits).all() and logits.std(axis=1).min() > 0


def _llama_cpp_vectors(vocab_file: Path) -> list[tuple[str, list[int]]]:
    """ggml-vocab-<name>.gguf.inp/.out: texts and llama.cpp's expected ids (made upstream
    with HF), parsed as its tests/test-tokenizer-0.cpp does."""
    raw = Path(str(vocab_file) + ".inp").read_bytes().decode("utf-8")
    texts = raw.split("\n__ggml_vocab_test__\n")
    if texts and texts[-1] == "":
        texts.pop()
    lines = Path(str(vocab_file) + ".out").read_text(encoding="utf-8").split("\n")[: len(texts)]
    assert len(texts) == len(lines) > 10
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]


def test_engine_tokenizes_like_the_references(converted_pre):
    """llama.cpp's own vectors where it ships them (add_special=false, parse_special=false,
    as test-tokenizer-0 runs them; V3 has none), and HF `tokenizers` over the corpus."""
    name, hf, llm, vocab_file, _ = converted_pre
    if vocab_file is not None:
        cases = _llama_cpp_vectors(vocab_file)
        bad = [(t, _engine_ids(llm, t, special=False), e) for t, e in cases]
        bad = [b for b in bad if b[1] != b[2]]
        assert not bad, "llama.cpp's vectors: " + _format_mismatches(bad, len(cases))
    known = KNOWN_DIVERGENCE.get(name)
    texts = [t for t in CORPUS + fuzz_corpus() if not (known and known.search(t))]
    bad = []
    for t in texts:
        ref = hf.encode(t, add_special_tokens=False).ids
        got = _engine_ids(llm, t, special=True)
        if got != ref:
            bad.append((t, got, ref))
    assert not bad, "HF tokenizers: " + _format_mismatches(bad, len(texts))


def test_vocabulary_as_upstream_wrote_it(converted_pre):
    """Tokens, token types and merges in our conversion equal those in upstream's own
    ggml-vocab-<name>.gguf (written by llama.cpp's converter from the original tokenizer)."""
    name, _, _, vocab_file, out = converted_pre
    if vocab_file is None:
        pytest.skip(f"not applicable: llama.cpp ships no {name} vocabulary file to compare with")
    ref = gguf.GGUFReader(vocab_file).fields
    ours = gguf.GGUFReader(out).fields
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        assert list(ours[key].contents()) == list(ref[key].contents()), key
    # These files predate upstream's converter marking added tokens that look like markers
    # ("<|...|>", "<｜...｜>") CONTROL, as it does now and as we do; every other type agrees.
    tokens = ref["tokenizer.ggml.tokens"].contents()
    T = gguf.TokenType
    for i, (a, b) in enumerate(zip(ours["tokenizer.ggml.token_type"].contents(),
                                   ref["tokenizer.ggml.token_type"].contents())):
        if (a, b) == (T.CONTROL, T.USER_DEFINED) and tk._looks_like_control(tokens[i]):
            continue
        assert a == b, (i, tokens[i], a, b)
