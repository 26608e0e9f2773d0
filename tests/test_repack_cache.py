"""The repack cache (Llama(repack_cache=...), DEEPSEEK_CPU_REPACK_CACHE; src/dsc/repack-cache.cpp): the
first load writes the repacked weights to disk, later loads map them. Each later load must give the
logits of a load without the cache, bit for bit, and must really run from the file (its pages mapped
in the process); a cache that no longer matches its model, or that is damaged, is written again and
never used."""
import contextlib
import io
import os
from pathlib import Path

import numpy as np
import pytest

MODEL = "v2_lite"
TOKENS = [3, 17, 42, 99, 120, 7, 250, 31, 64, 128, 200, 11]


@pytest.fixture(scope="module")
def q4(converted, tmp_path_factory):
    """The fixture at q4_0: weights the engine repacks (an f32 model has nothing to cache)."""
    from deepseek_cpu.hub.conversion import quantize
    return str(quantize(converted(MODEL, "f32"), tmp_path_factory.mktemp("q4") / f"{MODEL}-q4_0.gguf", "q4_0",
                        progress=False, nthread=2))


@pytest.fixture(scope="module")
def plain_logits(q4):
    """Logits of a load without the cache (the engine's repacked kernels, repacked at load)."""
    from deepseek_cpu import Llama
    llm = Llama(q4, n_ctx=64, logits_all=True, verbose=False, repack_cache=False)
    try:
        return _logits(llm)
    finally:
        llm.close()


def _logits(llm):
    llm.reset()
    llm.eval(TOKENS)
    return np.asarray(llm.scores[:len(TOKENS)]).copy()


def _repack_mappings() -> dict[str, int]:
    """This process's mapped .repack files and their resident KiB (/proc/self/smaps)."""
    out, cur = {}, None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if parts and "-" in parts[0] and len(parts) >= 6 and parts[-1].endswith(".repack"):
            cur = parts[-1]
            out.setdefault(cur, 0)
        elif parts and "-" in parts[0]:
            cur = None
        elif cur and parts[0] == "Rss:":
            out[cur] += int(parts[1])
    return out


def _load(path, cache_dir, **kw):
    """(logits, the engine's log of the load, .repack files mapped while loaded)."""
    from deepseek_cpu import Llama
    log = io.StringIO()
    with contextlib.redirect_stderr(log):
        llm = Llama(path, n_ctx=64, logits_all=True, verbose=True, repack_cache=str(cache_dir), **kw)
    try:
        return _logits(llm), log.getvalue(), _repack_mappings()
    finally:
        llm.close()


def _cache_file(cache_dir) -> Path:
    files = list(Path(cache_dir).glob("*.repack"))
    assert len(files) == 1, files
    return files[0]


def test_first_load_writes_later_loads_map_the_same_weights(q4, plain_logits, tmp_path):
    logits, log, mapped = _load(q4, tmp_path)
    assert "repack cache: will write" in log and "repack cache: wrote" in log, log[-2000:]
    assert not mapped  # this load repacked in memory
    cache = _cache_file(tmp_path)
    assert cache.name.startswith(f"{MODEL}-q4_0-")
    np.testing.assert_array_equal(logits, plain_logits)

    for _ in range(2):
        logits, log, mapped = _load(q4, tmp_path)
        assert "repack cache: mapped" in log and "repack cache: wrote" not in log, log[-2000:]
        # the weights ran from the file: its pages are in this process
        assert mapped.get(str(cache), 0) > 0, mapped
        np.testing.assert_array_equal(logits, plain_logits)
    assert list(Path(tmp_path).iterdir()) == [cache]  # no temporary files left


def test_a_changed_model_rewrites_the_cache(q4, plain_logits, tmp_path):
    _load(q4, tmp_path)
    cache = _cache_file(tmp_path)
    first = cache.stat().st_mtime_ns
    st = os.stat(q4)
    try:
        os.utime(q4, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # the model "changed"
        logits, log, mapped = _load(q4, tmp_path)
    finally:
        os.utime(q4, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert "does not match" in log and "repack cache: wrote" in log, log[-2000:]
    assert not mapped
    np.testing.assert_array_equal(logits, plain_logits)
    assert _cache_file(tmp_path) == cache and cache.stat().st_mtime_ns != first  # rewritten in place


@pytest.mark.parametrize("damage", ["truncated", "header byte", "garbage"])
def test_a_damaged_cache_is_never_used(q4, plain_logits, tmp_path, damage):
    _load(q4, tmp_path)
    cache = _cache_file(tmp_path)
    raw = bytearray(cache.read_bytes())
    if damage == "truncated":
        raw = raw[:-4096]
    elif damage == "header byte":
        raw[100] ^= 0xFF  # inside the identity (build, CPU features, model header...)
    else:
        raw = bytearray(os.urandom(len(raw)))
    cache.write_bytes(bytes(raw))
    logits, log, mapped = _load(q4, tmp_path)
    assert "repack cache: wrote" in log and not mapped, log[-2000:]
    np.testing.assert_array_equal(logits, plain_logits)
    # and the rewritten cache is then used
    logits, log, mapped = _load(q4, tmp_path)
    assert mapped and "repack cache: mapped" in log
    np.testing.assert_array_equal(logits, plain_logits)


def test_an_unwritable_cache_directory_only_warns(q4, plain_logits, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the directory should be")
    logits, log, mapped = _load(q4, blocker / "repack")
    assert "repack cache: not written" in log and not mapped, log[-2000:]
    np.testing.assert_array_equal(logits, plain_logits)


def test_environment_variable_and_off(q4, plain_logits, tmp_path, monkeypatch):
    from deepseek_cpu import Llama
    from deepseek_cpu.runtime import repack_cache
    monkeypatch.setenv(repack_cache.ENV, str(tmp_path))
    llm = Llama(q4, n_ctx=64, logits_all=True, verbose=False)
    llm.close()
    assert _cache_file(tmp_path)
    (tmp_path / "off").mkdir()
    monkeypatch.setenv(repack_cache.ENV, str(tmp_path / "off"))
    llm = Llama(q4, n_ctx=64, logits_all=True, verbose=False, repack_cache=False)
    try:
        np.testing.assert_array_equal(_logits(llm), plain_logits)
    finally:
        llm.close()
    assert not list((tmp_path / "off").iterdir())
    assert os.environ[repack_cache.ENV] == str(tmp_path / "off")  # restored after the load


def test_directory_values(tmp_path, monkeypatch):
    from deepseek_cpu.runtime import repack_cache
    monkeypatch.setenv("DEEPSEEK_CPU_CACHE", str(tmp_path))
    assert repack_cache.directory(True) == str(tmp_path / "repack")
    assert repack_cache.directory("") == str(tmp_path / "repack")
    assert repack_cache.directory(False) == "0"
    assert repack_cache.directory(None) is None
    assert repack_cache.directory(tmp_path / "x") == str(tmp_path / "x")
    with pytest.raises(ValueError, match="repack_cache"):
        repack_cache.directory(3)


def test_with_a_memory_budget_the_rest_comes_from_the_cache(q4, tmp_path, monkeypatch):
    """Under a budget the routed experts stay in the model's file mapping; the weights that are
    still repacked come from the cache: same logits as the budget without it."""
    from deepseek_cpu import Llama
    monkeypatch.setenv("DEEPSEEK_CPU_CACHE", str(tmp_path / "cache"))  # the budget's expert statistics
    llm = Llama(q4, n_ctx=64, logits_all=True, verbose=False, mem_budget="1G", repack_cache=False)
    try:
        budget_only = _logits(llm)
    finally:
        llm.close()
    _load(q4, tmp_path / "rc", mem_budget="1G")
    logits, log, mapped = _load(q4, tmp_path / "rc", mem_budget="1G")
    assert "repack cache: mapped" in log and mapped, log[-2000:]
    np.testing.assert_array_equal(logits, budget_only)


def _cli(*args):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "deepseek_cpu", *args], capture_output=True, text=True, timeout=300)


def test_command_line(q4, tmp_path, monkeypatch):
    """`run --repack-cache DIR` writes the cache there; `serve --repack-cache` hands llama-server the
    default directory (<cache root>/repack)."""
    monkeypatch.setenv("DEEPSEEK_CPU_CACHE", str(tmp_path / "root"))
    r = _cli("run", q4, "-p", "Hello", "-n", "2", "--repack-cache", str(tmp_path / "rc"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert _cache_file(tmp_path / "rc").stat().st_size > 0
    r = _cli("serve", q4, "--repack-cache", "--dry-run")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"DEEPSEEK_CPU_REPACK_CACHE={tmp_path / 'root' / 'repack'}" in r.stdout, r.stdout
