import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from fixture_paths import FIXTURES, REPO, cached_sdist, checkpoint_names, fixture_dir  # noqa: F401 (re-exported)

# a fixture's files: fixture_dir(name), never FIXTURES / name (v2_group is package data)
# the V2 / V3 / V3.2 fixtures (converters/deepseek.py); DeepSeek-V4's have their own tests (test_deepseek_v4.py)
V4_CHECKPOINTS = ["v4_flash", "trained_v4"]
CHECKPOINTS = [n for n in checkpoint_names() if n not in V4_CHECKPOINTS]

# the test suite runs on 2-core machines; keep llama.cpp from oversubscribing
os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """Each fixture checkpoint converted once per session, by outtype: converted(name, outtype)."""
    from deepseek_cpu.conversion.convert import convert
    cache = {}
    out_dir = tmp_path_factory.mktemp("gguf")

    def get(name: str, outtype: str = "f32") -> Path:
        key = (name, outtype)
        if key not in cache:
            cache[key] = convert(fixture_dir(name), out_dir / f"{name}-{outtype}.gguf", outtype=outtype, progress=False)
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
    found = cached_sdist()
    if found is None:
        return None
    tarball, pin = found
    out = Path(os.environ.get("DEEPSEEK_CPU_TEST_CACHE", Path.home() / ".cache" / "deepseek-cpu-tests")) / "llama.cpp-models"
    if not (out / "done-all-vocabs").exists():
        prefix = pin["llama_cpp_dir"] + "/models/ggml-vocab-"
        with tarfile.open(tarball) as tf:
            members = [m for m in tf.getmembers() if m.name.startswith(prefix)]
            tf.extractall(out, members=members, filter="data")
        (out / "done-all-vocabs").touch()
    return out / pin["llama_cpp_dir"]


# -- disk: the suite writes GiB-sized synthetic models under the temporary directory --------

# what one whole run of the suite needs free there: on Zen 5 it peaked at 9.6 GiB more than it
# started with (its module fixtures' models live until the session ends), plus a margin. A start
# with less stops at once, with the fix, instead of "No space left on device" halfway through
DISK_NEEDED_GIB = 12
_disk = {"start_used": 0, "peak_used": 0, "free": 0, "stop": threading.Event()}


def _disk_sampler(path: str) -> None:
    while not _disk["stop"].wait(1.0):
        _disk["peak_used"] = max(_disk["peak_used"], shutil.disk_usage(path).used)


def pytest_sessionstart(session):
    where = tempfile.gettempdir()
    usage = shutil.disk_usage(where)
    _disk.update(start_used=usage.used, peak_used=usage.used, free=usage.free, where=where)
    if usage.free < DISK_NEEDED_GIB * 2**30:
        msg = (f"only {usage.free / 2**30:.1f} GiB free in {where}; the test suite needs "
               f"{DISK_NEEDED_GIB} GiB there for its models (point TMPDIR at a bigger disk)")
        # the whole suite stops; a chosen file or test may need far less, so it only warns
        tests = Path(__file__).resolve().parent
        if all(Path(a.split("::")[0]).resolve() == tests for a in session.config.args):
            pytest.exit(msg, returncode=1)
        session.config.issue_config_time_warning(pytest.PytestWarning(msg), stacklevel=2)
    threading.Thread(target=_disk_sampler, args=(where,), daemon=True).start()


def _disk_line() -> str:
    _disk["stop"].set()
    grew = (_disk["peak_used"] - _disk["start_used"]) / 2**30
    return (f"disk: {_disk['free'] / 2**30:.1f} GiB free in {_disk.get('where')} at the start; "
            f"the run used at most {grew:.1f} GiB more (anything on that disk counts)")


# -- what the run proved: the closing lines of every pytest run -----------------------------

# x86 kernel levels: (the name in ggml's system info, the /proc/cpuinfo flags they need)
KERNEL_LEVELS = {"AVX2": ("AVX2", ["avx2", "fma"]), "AVX-512": ("AVX512", ["avx512f", "avx512bw", "avx512vl"]),
                 "AVX-512 VNNI": ("AVX512_VNNI", ["avx512_vnni"]), "AMX": ("AMX_INT8", ["amx_int8", "amx_tile"])}


def kernel_coverage() -> str:
    """Which kernel paths the loaded engine has compiled in, and which of those this CPU runs."""
    import re
    try:
        import llama_cpp
        from deepseek_cpu.runtime.engine import cpu_flags
        info = llama_cpp.llama_print_system_info().decode()
        flags = set(cpu_flags())
    except Exception as e:  # noqa: BLE001 - a report line, never a failure
        return f"kernel paths: unknown ({type(e).__name__}: {e})"
    model = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                  if l.startswith("model name")), "unknown CPU")
    from deepseek_cpu.runtime.engine import amx_status
    amx_on = amx_status() == "on"  # our AMX path also needs the kernel's permission
    ran, compiled_only = [], []
    for level, (key, needs) in KERNEL_LEVELS.items():
        built = re.search(rf"\b{key} = 1\b", info) is not None
        if built and all(f in flags for f in needs) and (level != "AMX" or amx_on):
            ran.append(level)
        else:
            compiled_only.append(level)
    return (f"kernel paths on {model}: ran {', '.join(ran) or 'none'}; "
            f"compiled only (tests/test_kernel_isa.py): {', '.join(compiled_only) or 'none'}")


# Under CI (CI=true) a skip is a failure unless its reason says why it can never run there:
# "not applicable: ..." (nothing to test for this case) or "CPU lacks ..." (a fact of the
# hardware, read from /proc/cpuinfo). Anything else -- a package that could not be fetched, a
# missing build output -- is a hole in what CI proves.
CI_SKIP_REASONS = ("not applicable:", "CPU lacks")

# What a runner may lack that real-environment tests need (the multi-host tests' network
# namespaces, the real memory limits' cgroups (v1 and v2), AMX tiles the kernel must hand out). A test that
# cannot run for want of one calls runner_lacks(); under CI that skip is a failure unless the
# runner declares the lack: DEEPSEEK_CPU_RUNNER_LACKS=root,netns (comma-separated). Otherwise a
# runner without root would drop every multi-host and memory-limit test and stay green.
RUNNER_CAPABILITIES = {
    "root": "root (uid 0): network namespaces, memory cgroups",
    "netns": "network namespaces and iproute2 (`ip netns add`)",
    "cgroup1": "the cgroup v1 memory controller at /sys/fs/cgroup/memory",
    "cgroup2": "a cgroup v2 hierarchy with the memory controller (memory.max); where v1 holds it, v2 offers none",
    "amx": "AMX tiles on a CPU that has them (kernel tile state, DEEPSEEK_CPU_AMX not 0)",
}
RUNNER_LACKS_ENV = "DEEPSEEK_CPU_RUNNER_LACKS"
_RUNNER_LACKS_PREFIX = "not applicable: this runner lacks "


def declared_lacks() -> set[str]:
    """The capabilities this runner declares it lacks ($DEEPSEEK_CPU_RUNNER_LACKS)."""
    return {c.strip() for c in os.environ.get(RUNNER_LACKS_ENV, "").split(",") if c.strip()}


def runner_lacks(capability: str, detail: str):
    """Skip: this runner lacks `capability` (a RUNNER_CAPABILITIES key); `detail` says how that was
    found. Under CI the skip fails unless the runner declared the lack (pytest_runtest_makereport)."""
    assert capability in RUNNER_CAPABILITIES, capability
    pytest.skip(f"{_RUNNER_LACKS_PREFIX}{capability} ({detail})")


def pytest_configure(config):
    unknown = declared_lacks() - set(RUNNER_CAPABILITIES)
    if unknown:
        raise pytest.UsageError(f"{RUNNER_LACKS_ENV}: unknown {', '.join(sorted(unknown))}; "
                                f"known: {', '.join(RUNNER_CAPABILITIES)}")


def ci_skip_failure(reason: str) -> str | None:
    """Why a skip with this reason fails under CI, or None where it may stand."""
    if not reason.startswith(CI_SKIP_REASONS):
        return f"skipped under CI, which must run it: {reason}"
    if reason.startswith(_RUNNER_LACKS_PREFIX):
        capability = reason[len(_RUNNER_LACKS_PREFIX):].split(" ", 1)[0]
        if capability not in declared_lacks():
            return (f"skipped under CI on a runner that does not declare it lacks {capability!r}: {reason}. "
                    f"Give the runner {RUNNER_CAPABILITIES.get(capability, capability)}, or declare "
                    f"{RUNNER_LACKS_ENV}={capability} where it can never have it (docs/engine.md#tests)")
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not os.environ.get("CI") or not rep.skipped or hasattr(rep, "wasxfail"):
        return
    longrepr = rep.longrepr
    reason = (longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)).removeprefix("Skipped: ")
    failure = ci_skip_failure(reason)
    if failure:
        rep.outcome = "failed"
        rep.longrepr = failure


def pytest_terminal_summary(terminalreporter):
    from collections import Counter
    stats = terminalreporter.stats
    reasons = Counter()
    for rep in stats.get("skipped", []):
        longrepr = rep.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")[:120]] += 1
    n_run = sum(len(stats.get(k, [])) for k in ("passed", "failed", "xfailed", "xpassed"))
    skipped = sum(reasons.values())
    line = f"coverage: {n_run} tests ran, {skipped} skipped"
    if reasons:
        line += " -- " + "; ".join(f"{n} x {r}" for r, n in reasons.most_common())
    terminalreporter.write_line(line)
    if declared_lacks():
        terminalreporter.write_line(f"this runner declares it lacks ({RUNNER_LACKS_ENV}): "
                                    f"{', '.join(sorted(declared_lacks()))}; tests that need it were not run")
    terminalreporter.write_line(kernel_coverage())
    terminalreporter.write_line(_disk_line())
