import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
CHECKPOINTS = sorted(p.name for p in FIXTURES.iterdir() if (p / "reference.npz").exists()) if FIXTURES.exists() else []

# the test suite runs on 2-core machines; keep llama.cpp from oversubscribing
os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """Each fixture checkpoint converted once per session, by outtype: converted(name, outtype)."""
    from deepseek_cpu.convert import convert
    cache = {}
    out_dir = tmp_path_factory.mktemp("gguf")

    def get(name: str, outtype: str = "f32") -> Path:
        key = (name, outtype)
        if key not in cache:
            cache[key] = convert(FIXTURES / name, out_dir / f"{name}-{outtype}.gguf", outtype=outtype, progress=False)
        return cache[key]
    return get


def run_python(code: str, env_extra: dict | None = None, unset=(), timeout=120) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (start-up .pth files included)."""
    env = dict(os.environ)
    for k in unset:
        env.pop(k, None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


def llama_cpp_source_dir() -> Path | None:
    """The pinned llama.cpp tree (for its test vectors): $DEEPSEEK_CPU_LLAMA_SRC, else the
    patched tree our build unpacked, else the files unpacked from the cached sdist."""
    env = os.environ.get("DEEPSEEK_CPU_LLAMA_SRC")
    if env:
        return Path(env)
    for d in sorted(REPO.glob("build/*/patched-src/llama.cpp")):
        if (d / "models").is_dir():
            return d
    import tarfile
    import tomllib
    pin = tomllib.loads((REPO / "vendor" / "pin.toml").read_text())["sdist"]
    sys.path.insert(0, str(REPO / "vendor"))
    try:
        import prepare
        tarball = prepare.cache_dir() / pin["filename"]
    finally:
        sys.path.pop(0)
    if not tarball.exists():
        return None
    out = Path(os.environ.get("DEEPSEEK_CPU_TEST_CACHE", Path.home() / ".cache" / "deepseek-cpu-tests")) / "llama.cpp-models"
    if not (out / "done-all-vocabs").exists():
        prefix = pin["llama_cpp_dir"] + "/models/ggml-vocab-"
        with tarfile.open(tarball) as tf:
            members = [m for m in tf.getmembers() if m.name.startswith(prefix)]
            tf.extractall(out, members=members, filter="data")
        (out / "done-all-vocabs").touch()
    return out / pin["llama_cpp_dir"]
