"""A damaged GGUF never takes the process down: it loads, or the caller gets an exception.

A server or notebook that opens a corrupt download must survive it. Each file here is a
valid small model (the v2_greedy fixture, converted) with one thing broken: a token made
equal to another, bytes flipped in the header, the metadata, the token list or the tensor
infos, or the file cut short. Each is opened in a child process, one after another; a
child that dies of a signal (an abort in the engine) is recorded and the next file goes
to a fresh child.
"""
from __future__ import annotations

import random
import struct
import textwrap
from pathlib import Path

import pytest

from child_loads import run_in_children
from gguf_summary import value_span

gguf = pytest.importorskip("gguf")

SEEDS_PER_KIND = 40
KINDS = ("duplicate_token", "hparam", "header", "metadata", "token_list", "tensor_infos", "truncated")
# values a damaged or hand-made file may hold in a model's integer hyperparameters
ODD_VALUES = (0, 1, 2, 3, 7, 255, 4096, 1 << 20, 1 << 31, (1 << 32) - 1)

# loads each path named on stdin; prints one JSON line per file before and after, so the
# parent knows which file a crash happened on. verbose=False sends llama.cpp's log to /dev/null
# while a model loads, and the exception says only "Failed to load model from file"; the reason
# the loader gives is in its error log, so the child records the error-level lines it sees
CHILD = textwrap.dedent("""
    import json, sys
    from deepseek_cpu import Llama
    from deepseek_cpu.runtime import llama_log
    errors = []
    _write, _level = llama_log._log_write, [0]
    def _record(level, text):
        if level != 5:  # GGML_LOG_LEVEL_CONT continues the line before
            _level[0] = level
        if _level[0] == 4 and text:  # GGML_LOG_LEVEL_ERROR
            errors.append(text.decode("utf-8", "replace"))
        _write(level, text)
    llama_log._log_write = _record
    for line in sys.stdin:
        path = line.strip()
        print(json.dumps({"start": path}), flush=True)
        errors.clear()
        try:
            llm = Llama(path, n_ctx=32, n_threads=1, verbose=False)
            ids = llm.tokenize(b"Hello world", add_bos=False)
            llm.eval(ids[:2])
            llm.close()
            out = {"path": path, "outcome": "loaded", "n_ids": len(ids)}
        except Exception as e:
            out = {"path": path, "outcome": "exception", "type": type(e).__name__, "message": str(e)[:200]}
        out["log"] = "".join(errors)[-1000:]
        print(json.dumps(out), flush=True)
""")


def _regions(path: Path) -> dict[str, tuple[int, int]]:
    """Byte ranges [start, end) of the parts of a GGUF file that the mutations target."""
    r = gguf.GGUFReader(path)
    fields = list(r.fields.values())
    kv = [f for f in fields if not f.name.startswith("GGUF.")]
    tokens = r.fields["tokenizer.ggml.tokens"]
    after_tokens = min((f.offset for f in kv if f.offset > tokens.offset), default=r.tensors[0].field.offset)
    ti_start = r.tensors[0].field.offset
    ti_end = r.data_offset
    return {"header": (0, kv[0].offset), "metadata": (kv[0].offset, ti_start),
            "token_list": (tokens.offset, after_tokens), "tensor_infos": (ti_start, ti_end)}


def _duplicate_token(data: bytearray, tokens: list[str], regions, rng: random.Random) -> str:
    """Overwrite one token string with another of the same byte length (the file stays
    well-formed; the vocabulary now has two equal entries)."""
    by_len: dict[int, list[int]] = {}
    for i, t in enumerate(tokens):
        by_len.setdefault(len(t.encode("utf-8")), []).append(i)
    groups = [ids for ids in by_len.values() if len(ids) > 1]
    ids = rng.choice(groups)
    a, b = rng.sample(ids, 2)
    ta, tb = tokens[a].encode(), tokens[b].encode()
    start, end = regions["token_list"]
    needle = struct.pack("<Q", len(tb)) + tb
    pos = data.find(needle, start, end)
    assert pos >= 0
    data[pos + 8: pos + 8 + len(tb)] = ta
    return f"token {b} set to token {a}'s text {tokens[a]!r}"


def _hparam_offsets(path: Path) -> dict[str, int]:
    """File offset of the value of each scalar 32-bit integer key of the architecture and
    the tokenizer (layer, head, expert counts, lengths, token ids)."""
    r = gguf.GGUFReader(path)
    found = {}
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or len(f.types) != 1:
            continue
        if f.types[0] in (gguf.GGUFValueType.UINT32, gguf.GGUFValueType.INT32):
            start, end = value_span(f)
            assert end - start == 4
            found[name] = start
    return found


def _mutants(valid: Path, out_dir: Path) -> list[tuple[Path, str]]:
    base = valid.read_bytes()
    regions = _regions(valid)
    tokens = [str(t) for t in gguf.GGUFReader(valid).fields["tokenizer.ggml.tokens"].contents()]
    hparams = _hparam_offsets(valid)
    made = []
    for kind in KINDS:
        for seed in range(SEEDS_PER_KIND):
            rng = random.Random(f"{kind}-{seed}")
            data = bytearray(base)
            if kind == "duplicate_token":
                what = _duplicate_token(data, tokens, regions, rng)
            elif kind == "hparam":
                key = rng.choice(sorted(hparams))
                value = rng.choice(ODD_VALUES)
                data[hparams[key]: hparams[key] + 4] = struct.pack("<I", value)
                what = f"{key} = {value}"
            elif kind == "truncated":
                cut = rng.randrange(1, len(data))
                del data[cut:]
                what = f"cut at byte {cut} of {len(base)}"
            else:
                start, end = regions[kind]
                n = rng.choice((1, 1, 2, 4))
                where = sorted(rng.randrange(start, end) for _ in range(n))
                for pos in where:
                    data[pos] ^= 1 << rng.randrange(8) if rng.random() < 0.5 else rng.randrange(1, 256)
                what = f"bytes {where} changed"
            path = out_dir / f"{kind}-{seed:02d}.gguf"
            path.write_bytes(bytes(data))
            made.append((path, f"{kind}: {what}"))
    return made


def _load_all(paths: list[Path]) -> dict[str, dict]:
    """Outcome per file; a child killed by a signal marks the file it was on and a fresh
    child goes on with the rest."""
    return run_in_children(CHILD, [str(p) for p in paths], "path")


@pytest.fixture(scope="module")
def valid(converted):
    return converted("v2_greedy", "f32")


@pytest.fixture(scope="module")
def mutants(valid, tmp_path_factory):
    return _mutants(valid, tmp_path_factory.mktemp("mutants"))


@pytest.fixture(scope="module")
def outcomes(valid, mutants):
    # the undamaged file goes first through the same child: the positive control
    return _load_all([valid] + [p for p, _ in mutants])


def test_the_undamaged_file_loads_through_the_same_harness(valid, outcomes):
    """A loader (or harness) that failed every file would pass the tests below; this one
    file, as converted, must load, tokenize and evaluate, with nothing in the error log."""
    r = outcomes[str(valid)]
    assert r["outcome"] == "loaded", r
    assert r["n_ids"] >= 2 and r["log"] == "", r


def test_no_damaged_file_kills_the_process(mutants, outcomes):
    died = [(what, outcomes[str(p)]) for p, what in mutants if outcomes[str(p)]["outcome"] == "died"]
    assert not died, f"{len(died)} of {len(mutants)} damaged files killed the process:\n" + "\n".join(
        f"  {what}: {r['signal']} {r['stderr']}" for what, r in died[:10])
    assert len(outcomes) == len(mutants) + 1


def test_duplicate_tokens_are_a_clear_error(valid, mutants, outcomes):
    """Not any failure: the loader names the problem (patches/fixes/loader-malformed-vocab-and-
    hparams-are-errors.patch), counting the tokens and the distinct strings among them."""
    n_tokens = len(gguf.GGUFReader(valid).fields["tokenizer.ggml.tokens"].contents())
    reason = (f"invalid vocabulary: {n_tokens} tokens but {n_tokens - 1} distinct token strings "
              f"in tokenizer.ggml.tokens")
    dup = [(p, what) for p, what in mutants if what.startswith("duplicate_token")]
    assert len(dup) == SEEDS_PER_KIND
    for p, what in dup:
        r = outcomes[str(p)]
        assert r["outcome"] == "exception" and r["type"] == "ValueError", (what, r)
        assert r["message"] == f"Failed to load model from file: {p}", (what, r)
        assert reason in r["log"], (what, reason, r)


def test_every_failed_load_gives_the_loaders_reason(mutants, outcomes):
    """A load that fails does so in the loader, which says why: "error loading model: <reason>"
    in llama.cpp's error log (the exception itself only says the load failed)."""
    vague = []
    for p, what in mutants:
        r = outcomes[str(p)]
        if r["outcome"] == "exception" and r["type"] == "ValueError":
            reason = r["log"].partition("error loading model: ")[2].strip()
            if not reason:
                vague.append((what, r))
    assert not vague, f"{len(vague)} failed loads without a reason:\n" + "\n".join(map(str, vague[:10]))


def test_every_kind_of_damage_is_tried(mutants, outcomes):
    """The mutations reach the loader's checks: each kind gives some exceptions (a kind that
    only ever loads would mean its bytes are never read)."""
    for kind in KINDS:
        got = [outcomes[str(p)]["outcome"] for p, what in mutants if what.startswith(kind + ":")]
        assert got.count("exception") > 0, (kind, got)


# DeepSeek-V3.2's indexer settings that llama.cpp's graph asserts on (its Hadamard rotation has
# matrices of power-of-two sizes >= 64 only): stock aborts at context creation
V32_BAD = (("deepseek32.attention.indexer.key_length", 32), ("deepseek32.attention.indexer.key_length", 96),
           ("deepseek32.attention.indexer.head_count", 0), ("deepseek32.attention.indexer.top_k", 0),
           ("deepseek32.rope.dimension_count", 128))


def test_v32_indexer_settings_the_graph_cannot_run_are_load_errors(converted, tmp_path):
    valid = converted("v32_dsa", "f32")
    offsets, base = _hparam_offsets(valid), valid.read_bytes()
    paths = [valid]  # the positive control: the file as converted loads
    for i, (key, value) in enumerate(V32_BAD):
        data = bytearray(base)
        data[offsets[key]: offsets[key] + 4] = struct.pack("<I", value)
        paths.append(tmp_path / f"v32-{i}.gguf")
        paths[-1].write_bytes(bytes(data))
    out = _load_all(paths)
    assert out[str(valid)]["outcome"] == "loaded", out[str(valid)]
    for p, (key, value) in zip(paths[1:], V32_BAD):
        r = out[str(p)]
        assert r["outcome"] == "exception" and r["type"] == "ValueError", (key, value, r)
        # the checks of patches/fixes/deepseek32-indexer-hparams-are-load-errors.patch, not
        # some other failure: each message starts "deepseek32: " and names the setting
        reason = r["log"].partition("error loading model: ")[2]
        assert "deepseek32: " in reason, (key, value, r)
        assert ("rope dimension" if key.endswith("rope.dimension_count") else "indexer") in reason, (key, value, r)
