"""Tokenizer part of the torch-free HF -> GGUF converter for DeepSeek models.

Reads a Hugging Face ``tokenizer.json`` (+ ``tokenizer_config.json``) with
plain ``json`` and writes the byte-level BPE vocabulary the way llama.cpp's
``gpt2`` tokenizer expects it.  No transformers / tokenizers at runtime.

This file must stay free of relative imports: it is imported both as
``deepseek_cpu.converters.tokenizer`` and as a top-level ``tokenizer`` module.
Its errors derive from ``deepseek_cpu.errors.DeepseekCpuError`` when the package
is importable (always, once installed), else from a local stand-in.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field
from typing import Any

import gguf

try:
    from deepseek_cpu.errors import DeepseekCpuError
except ImportError:  # loaded as a top-level module, without the package (see above)
    class DeepseekCpuError(Exception):  # type: ignore[no-redef]
        """Stand-in root: without the package nothing can catch the real one anyway."""

__all__ = [
    "KNOWN_PRE_TOKENIZERS",
    "MissingTokenizer",
    "TokenizerData",
    "UnsupportedTokenizer",
    "detect_pre_tokenizer",
    "pre_tokenizer_signature",
    "read_tokenizer",
    "write_tokenizer",
]


class UnsupportedTokenizer(DeepseekCpuError, ValueError):
    """tokenizer.json describes something llama.cpp has no matching pre-tokenizer for."""


class MissingTokenizer(DeepseekCpuError, FileNotFoundError):
    """The model directory has no tokenizer.json."""


# ---------------------------------------------------------------------------
# Pre-tokenizer detection
# ---------------------------------------------------------------------------
#
# llama.cpp hard-codes one regex list per ``tokenizer.ggml.pre`` name, so the
# converter has to name the list that reproduces the HF pre-tokenizer.
# Upstream does that by hashing the token ids of a probe string, which needs
# the HF runtime and breaks whenever a vocabulary changes.  We instead compare
# the *structure* of ``pre_tokenizer`` (its steps and their regexes) with the
# structures the llama.cpp pre-types were transcribed from.  Each step is
# reduced to a small tuple holding only the fields that change the split.

Step = tuple[Any, ...]

# tokenizer.ggml.model for byte-level BPE: llama.cpp's name for its BPE vocabulary type
# (llama-vocab.cpp: "gpt2" -> LLAMA_VOCAB_TYPE_BPE), not a pre-tokenizer name.
TOKENIZER_MODEL = "gpt2"

# ByteLevel used purely as a byte->unicode mapping (the splitting happened in
# the Split steps before it).
_BYTELEVEL_NO_REGEX: Step = ("ByteLevel", False, False)

# The regexes are spelled with \u escapes on purpose: several code points in
# them (U+1F7D, U+1FBE, U+2126, U+212A, ...) have canonical equivalents, and
# any editor or tool that NFC-normalises the source would silently change the
# character class (and break the structural match).
_DEEPSEEK_LLM_LETTERS = (
    "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
    "\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
    "\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a"
    "\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d"
    "\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3"
    "\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115"
    "\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943]+"
)
_DEEPSEEK_LLM_PUNCT = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
# CJK Unified Ideographs + U+0800..U+4E00 (a blunt "most non-Latin BMP" range) + Hangul.
_DEEPSEEK_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
# CJK ideographs + Hiragana + Katakana.
_DEEPSEEK_V3_CJK = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"


def _split(regex: str) -> Step:
    return ("Split", regex, "Isolated", False)


KNOWN_PRE_TOKENIZERS: dict[str, tuple[Step, ...]] = {
    # DeepSeek-LLM, DeepSeek-MoE, DeepSeek-V2 / V2-Lite / V2.5.
    "deepseek-llm": (
        _split("[\r\n]"),
        _split(_DEEPSEEK_LLM_LETTERS),
        _split(_DEEPSEEK_LLM_PUNCT),
        _split("\\s+$"),
        _split(_DEEPSEEK_CJK),
        ("Digits", True),
        _BYTELEVEL_NO_REGEX,
    ),
    # DeepSeek-V3 / V3.1 / V3.2 / R1 (not the R1 Qwen/Llama distills).
    "deepseek-v3": (
        _split("\\p{N}{1,3}"),
        _split(_DEEPSEEK_V3_CJK),
        _split(
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
            "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
            "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
        ),
        _BYTELEVEL_NO_REGEX,
    ),
    # DeepSeek-Coder (v1) and DeepSeek-Coder-V2-Lite share this one.
    "deepseek-coder": (
        _split("[\r\n]"),
        _split("\\s?\\p{L}+"),
        _split("\\s?\\p{P}+"),
        _split(_DEEPSEEK_CJK),
        ("Digits", True),
        _BYTELEVEL_NO_REGEX,
    ),
    # Plain GPT-2: the ByteLevel step does the splitting with its built-in regex.
    # (The engine's name is "gpt-2"; "gpt2" is the name of the tokenizer *model*.)
    "gpt-2": (("ByteLevel", False, True),),
    # Llama 3 style BPE (used by the R1 Llama distills).
    "llama-bpe": (
        _split(
            "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
            "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
        ),
        _BYTELEVEL_NO_REGEX,
    ),
}


# Pre-tokenizers for which the engine skips BPE merges when a whole pre-token is in the
# vocabulary (llama-vocab.cpp sets ignore_merges for them); HF does the same only when the
# tokenizer.json model says "ignore_merges": true (Llama 3 does). A file whose flag
# disagrees would tokenize differently in the engine, so it is refused.
ENGINE_IGNORES_MERGES = frozenset({"llama-bpe"})


def _step_signature(step: dict[str, Any]) -> Step:
    kind = step.get("type")
    if kind == "Split":
        pattern = step.get("pattern", {})
        # A "String" pattern is a literal; keep it distinguishable from a regex.
        regex = pattern["Regex"] if "Regex" in pattern else ("literal", pattern.get("String"))
        return ("Split", regex, step.get("behavior"), bool(step.get("invert", False)))
    if kind == "Digits":
        return ("Digits", bool(step.get("individual_digits", False)))
    if kind == "ByteLevel":
        # trim_offsets only affects offsets, never the ids, so it is left out.
        return ("ByteLevel", bool(step.get("add_prefix_space", False)), bool(step.get("use_regex", True)))
    # Anything else (Metaspace, Whitespace, Punctuation, ...) is kept whole so
    # the error message shows it.
    return (str(kind), json.dumps(step, sort_keys=True, ensure_ascii=False))


def pre_tokenizer_signature(tokenizer_json: dict[str, Any]) -> tuple[Step, ...]:
    """The structural fingerprint of ``tokenizer_json["pre_tokenizer"]``."""
    pre = tokenizer_json.get("pre_tokenizer")
    if pre is None:
        return ()
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    return tuple(_step_signature(s) for s in steps)


def detect_pre_tokenizer(tokenizer_json: dict[str, Any]) -> str:
    """Name of the llama.cpp pre-tokenizer (``tokenizer.ggml.pre``) to use.

    Raises UnsupportedTokenizer when the structure matches no known type;
    silently picking a near match would tokenize differently from HF.
    """
    model_type = tokenizer_json.get("model", {}).get("type")
    if model_type != "BPE":
        raise UnsupportedTokenizer(f"tokenizer.json model type is {model_type!r}; only byte-level 'BPE' is supported")
    signature = pre_tokenizer_signature(tokenizer_json)
    for name, known in KNOWN_PRE_TOKENIZERS.items():
        if signature == known:
            ignores = bool(tokenizer_json["model"].get("ignore_merges", False))
            if ignores != (name in ENGINE_IGNORES_MERGES):
                raise UnsupportedTokenizer(
                    f"tokenizer.json has the {name!r} pre-tokenizer with model.ignore_merges={ignores}, but "
                    f"llama.cpp {'always' if name in ENGINE_IGNORES_MERGES else 'never'} skips merges for "
                    f"{name!r} vocabularies; the engine would tokenize differently from Hugging Face")
            return name
    found = "\n".join(f"  {i}: {step!r}" for i, step in enumerate(signature)) or "  (no pre_tokenizer)"
    raise UnsupportedTokenizer(
        "unrecognised tokenizer.json pre_tokenizer structure; found steps:\n"
        f"{found}\nknown llama.cpp pre-tokenizers: {', '.join(KNOWN_PRE_TOKENIZERS)}"
    )


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


@dataclass
class TokenizerData:
    tokens: list[str]
    token_types: list[int]  # gguf.TokenType values
    merges: list[str]  # "left right"
    pre: str
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None
    add_bos: bool | None = None
    add_eos: bool | None = None
    chat_template: str | None = None
    # Added tokens by content, handy for tests and for callers that need ids.
    added_tokens: dict[str, int] = field(default_factory=dict)


def _looks_like_control(text: str) -> bool:
    # DeepSeek ships role/tool markers such as <｜User｜> and <|EOT|> with
    # "special": false.  Upstream's converter still writes them as CONTROL so
    # llama.cpp hides them when printing; doing the same keeps our GGUFs
    # interchangeable with upstream ones.  Tokenization is unaffected: with
    # parse_special both CONTROL and USER_DEFINED are matched as whole tokens.
    return (text.startswith("<|") and text.endswith("|>")) or (text.startswith("<｜") and text.endswith("｜>"))


def _token_content(entry: Any) -> str | None:
    # tokenizer_config.json writes special tokens either as a plain string or
    # as a serialised AddedToken dict.
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    return None


def _merge_string(merge: Any) -> str:
    if isinstance(merge, str):
        return merge
    left, right = merge
    # The pair form exists so that parts may contain spaces; the GGUF keeps the
    # "a b" form, so write a literal space as its byte-level stand-in (U+0120)
    # exactly as gguf-py does.
    return " ".join(part.replace(" ", "\u0120") for part in (left, right))


def _pick_chat_template(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        template = named.get("default")
        return template if isinstance(template, str) else None
    return None


def _load_json(path: pathlib.Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_tokenizer(model_dir: pathlib.Path, vocab_size: int) -> TokenizerData:
    """Read ``model_dir``'s tokenizer into GGUF-ready lists.

    ``vocab_size`` is config.json's value; the embedding matrix is often larger
    than the tokenizer (DeepSeek-LLM: 102400 rows, 100002 tokens), and llama.cpp
    needs exactly one token per row, so the gap is filled with UNUSED
    ``[PAD{i}]`` entries.
    """
    model_dir = pathlib.Path(model_dir)
    tj_path = model_dir / "tokenizer.json"
    if not tj_path.is_file():
        raise MissingTokenizer(f"no tokenizer.json in {model_dir} (only HF 'fast' tokenizers are supported)")
    tj = _load_json(tj_path)
    pre = detect_pre_tokenizer(tj)

    model = tj["model"]
    by_id: dict[int, str] = {i: t for t, i in model["vocab"].items()}
    types: dict[int, int] = {i: gguf.TokenType.NORMAL for i in by_id}
    added: dict[str, int] = {}
    # Added tokens override the model vocab at the same id (V3 repeats
    # BOS/EOS/PAD in both).  Their text is stored raw, not byte-level encoded,
    # which is what llama.cpp expects for CONTROL/USER_DEFINED tokens.
    for tok in tj.get("added_tokens", []):
        tid, text = int(tok["id"]), tok["content"]
        by_id[tid] = text
        added[text] = tid
        special = tok.get("special", False) or _looks_like_control(text)
        types[tid] = gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED

    if by_id and max(by_id) >= vocab_size:
        raise UnsupportedTokenizer(f"{model_dir}: tokenizer has token id {max(by_id)} but config.json "
                                   f"vocab_size is {vocab_size}; the two files do not belong together")

    tokens: list[str] = []
    token_types: list[int] = []
    for i in range(vocab_size):
        if i in by_id:
            tokens.append(by_id[i])
            token_types.append(int(types[i]))
        else:
            tokens.append(f"[PAD{i}]")
            token_types.append(int(gguf.TokenType.UNUSED))

    data = TokenizerData(
        tokens=tokens,
        token_types=token_types,
        merges=[_merge_string(m) for m in model.get("merges", [])],
        pre=pre,
        added_tokens=added,
    )

    cfg_path = model_dir / "tokenizer_config.json"
    cfg = _load_json(cfg_path) if cfg_path.is_file() else {}
    for kind in ("bos", "eos", "pad"):
        content = _token_content(cfg.get(f"{kind}_token"))
        if content is not None and content in added:
            setattr(data, f"{kind}_id", added[content])
    # Leave add_bos/add_eos unset (None) when the config does not say: the
    # llama.cpp loader then applies its own per-tokenizer default.
    for kind in ("bos", "eos"):
        flag = cfg.get(f"add_{kind}_token")
        if isinstance(flag, bool):
            setattr(data, f"add_{kind}", flag)

    # Fall back to config.json ids when tokenizer_config.json is absent/silent.
    model_cfg_path = model_dir / "config.json"
    if model_cfg_path.is_file():
        model_cfg = _load_json(model_cfg_path)
        for kind in ("bos", "eos", "pad"):
            tid = model_cfg.get(f"{kind}_token_id")
            if getattr(data, f"{kind}_id") is None and isinstance(tid, int) and 0 <= tid < vocab_size:
                setattr(data, f"{kind}_id", tid)

    template = _pick_chat_template(cfg.get("chat_template"))
    jinja = model_dir / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    data.chat_template = template
    return data


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def write_tokenizer(writer: gguf.GGUFWriter, tok: TokenizerData) -> None:
    """Add the tokenizer.ggml.* keys (and chat template) to ``writer``."""
    writer.add_tokenizer_model(TOKENIZER_MODEL)
    writer.add_tokenizer_pre(tok.pre)
    writer.add_token_list(tok.tokens)
    writer.add_token_types(tok.token_types)
    writer.add_token_merges(tok.merges)
    # keys left out when the checkpoint does not say: the engine then applies its own default
    for value, add in ((tok.bos_id, writer.add_bos_token_id), (tok.eos_id, writer.add_eos_token_id),
                       (tok.pad_id, writer.add_pad_token_id), (tok.add_bos, writer.add_add_bos_token),
                       (tok.add_eos, writer.add_add_eos_token), (tok.chat_template, writer.add_chat_template)):
        if value is not None:
            add(value)
