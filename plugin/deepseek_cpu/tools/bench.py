"""`deepseek-cpu bench`: prefill / decode speed, time to first token, load time and peak
RSS of our engine, optionally side by side with stock llama.cpp (`--compare-stock`) and with an
ik_llama.cpp build (`--compare-ik DIR`, tools/ik_bench.py).

    deepseek-cpu bench model.gguf --pp 512 --tg 128 --repeat 3 --compare-stock --json out.json --plot out.png

Every engine run is its own child process (so peak RSS and load time are per engine and
nothing is shared but the page cache); with --compare-stock runs alternate, the order
flipping each repeat (ours, stock, stock, ours, ours, ...), and each metric is reported as
median [min-max] over the repeats, with the ratio of medians ours/stock.

Before the timed runs each engine loads the model once, untimed (--no-warm-load skips
it): the first load after the page-cache warm-up was measured to take up to 2-3x the
later ones (the kernel reclaims page cache for the new process's memory), and it would
land on whichever engine happened to run first.

This module runs the children and gathers their numbers; what one child measures is
tools/bench_child.py, the table and the chart tools/bench_report.py.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import ik_bench
from .bench_report import METRICS, format_table, metric_label, plot

# the face of bench: the run, and its report's names (imported from here by the command and benchmarks/)
__all__ = ["SCHEMA", "METRICS", "bench", "run_once", "ours_lib_dir", "summarize", "format_table", "metric_label",
           "plot"]

SCHEMA = "deepseek-cpu-bench/1"
IK_ENGINE = "ik"  # ik_llama.cpp's llama-bench (bench --compare-ik DIR)
MTP_ENGINE = "ours+mtp"  # ours with MTP drafts (bench --mtp): the same library, Llama(mtp=N)
# bench --mtp's default text: drafts are judged on text, not on random token ids; code and prose
# as DeepSeek's users send (the trained test models learnt Python's standard library)
MTP_TEXT = (
    "def read_config(path):\n"
    "    \"\"\"Read a configuration file and return its sections as a dictionary.\"\"\"\n"
    "    import configparser\n"
    "    parser = configparser.ConfigParser()\n"
    "    with open(path, encoding=\"utf-8\") as f:\n"
    "        parser.read_file(f)\n"
    "    return {name: dict(parser[name]) for name in parser.sections()}\n\n\n"
    "class Cache:\n"
    "    \"\"\"A small least-recently-used cache.\"\"\"\n\n"
    "    def __init__(self, size=128):\n")


# ------------------------------------------------------------------------------------
# the parent: the children's runs, interleaved and repeated
# ------------------------------------------------------------------------------------

def ours_lib_dir(explicit: str | None = None) -> Path:
    """Where our engine lives: --ours-lib, $LLAMA_CPP_LIB_PATH, this package's lib/, or
    an installed deepseek_cpu/lib on sys.path (a source checkout using the installed engine);
    the first that holds a libllama.so, by _dropin.find_lib_dir's rule."""
    from .. import _dropin
    from ..runtime.engine import EngineNotFound
    if explicit is not None:
        # measuring another engine than the one asked for would make the numbers a lie
        if not os.path.isfile(os.path.join(explicit, _dropin.LIBLLAMA)):
            raise EngineNotFound(f"--ours-lib {explicit}: no {_dropin.LIBLLAMA} there")
        return Path(explicit)
    found = _dropin.find_lib_dir()
    if found is None:
        raise EngineNotFound("deepseek-cpu's engine (deepseek_cpu/lib/libllama.so) was not found; "
                             "install deepseek-cpu or pass --ours-lib")
    return Path(found)


def _child_env(lib: Path) -> dict:
    env = dict(os.environ)
    env["LLAMA_CPP_LIB_PATH"] = str(lib)
    env.pop("DEEPSEEK_CPU_DISABLE", None)
    env.pop("MTMD_CPP_LIB", None)
    # the child must import this deepseek_cpu (where this process found it; not resolving links)
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run_once(engine: str, lib: Path, spec: dict, timeout: float, cgroup: str | None = None) -> dict:
    """One child run. cgroup: a cgroup directory (v1 memory controller or v2) the child joins
    before it starts, so its memory limit holds from the first allocation."""
    with tempfile.TemporaryDirectory(prefix="dsc-bench-") as tmp:
        s = {**spec, "engine": engine, "result": os.path.join(tmp, "result.json")}
        sp = os.path.join(tmp, "spec.json")
        Path(sp).write_text(json.dumps(s))
        t = time.perf_counter()
        try:
            def join():  # in the child, before exec
                Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))
            p = subprocess.run([sys.executable, "-m", "deepseek_cpu.tools.bench_child", sp],
                               env={**_child_env(lib), **spec.get("env", {})},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout,
                               preexec_fn=join if cgroup else None)
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
        wall = time.perf_counter() - t
        try:
            res = json.loads(Path(s["result"]).read_text())
        except (OSError, ValueError):
            tail = (p.stderr or "").strip().splitlines()[-15:]
            why = " (killed: out of memory?)" if p.returncode == -9 else ""
            res = {"ok": False, "error": f"child exited {p.returncode} without a result{why}", "stderr_tail": tail,
                   "returncode": p.returncode}
        if not res.get("ok") and "stderr_tail" not in res:
            res["stderr_tail"] = (p.stderr or "").strip().splitlines()[-15:]
        res["wall_s"] = wall
        return res


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if r.get("ok")]
    out = {}
    for m in METRICS:
        vals = [r[m] for r in ok if r.get(m) is not None]
        if vals:
            out[m] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals),
                      "values": vals}
    return out


def _gguf_info(path: str) -> dict:
    info = {"path": os.path.abspath(path), "size_bytes": os.path.getsize(path)}
    try:
        import gguf
        from ..gguf_header import read
        from .synth import ROUTING_KEY as SYNTH_ROUTING_KEY, SHAPE_KEY as SYNTH_SHAPE_KEY
        h = read(path)
        K = gguf.Keys
        info.update({"architecture": h.arch, "name": h.get(K.General.NAME), "file_type": h.get(K.General.FILE_TYPE),
                     "block_count": h.get(K.LLM.BLOCK_COUNT.format(arch=h.arch)),
                     "synthetic_shape": h.get(SYNTH_SHAPE_KEY), "synthetic_routing": h.get(SYNTH_ROUTING_KEY),
                     "n_tensors": len(h.tensors)})
        types: dict[str, int] = {}
        for t in h.tensors:
            types[t.type.name] = types.get(t.type.name, 0) + t.nbytes
        info["bytes_by_type"] = types
    except Exception as e:  # informational only
        info["error"] = str(e)
    return info


def _host() -> dict:
    from ..runtime.engine import cpu_features, cpu_model
    from ..runtime.resources import available_memory
    model = cpu_model()
    try:  # MemTotal
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        mem = 0
    return {"cpu": model, "cpus_online": os.cpu_count(), "cpu_features": cpu_features(), "mem_total_bytes": mem,
            "mem_available_bytes_at_start": available_memory(), "platform": platform.platform(),
            "python": platform.python_version(), "load_avg_at_start": os.getloadavg()}


def warm_page_cache(path: str) -> float:
    """Read the file once so that no engine pays the disk read (both then map it from the cache)."""
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(16 << 20)
        while f.readinto(buf):
            pass
    return time.perf_counter() - t


def bench(model: str, pp: int = 512, tg: int = 128, threads: int | None = None, repeat: int = 3,
          ctx_depth: int = 4096, compare_stock: bool = False, opts: dict | None = None,
          ours_opts: dict | None = None, stock_opts: dict | None = None, ours_lib: str | None = None,
          stock_lib: str | None = None, seed: int = 0, timeout: float = 3600, warm_cache: bool = True,
          warm_load: bool = True, mtp: int = 0, text: str | None = None, compare_ik: str | None = None,
          ik_flags: str | None = None, log=None) -> dict:
    """Run the benchmark (see the module docstring); returns the JSON-ready result.

    mtp: N > 0 adds the engine "ours+mtp" (ours with N MTP drafts a step), and every engine also
    generates tg tokens greedily after `text` (default: MTP_TEXT); ours+mtp measures only that.
    compare_ik: an ik_llama.cpp bin directory: adds the engine "ik" (its llama-bench, run with
    ik_flags, default ik_bench.IK_DEFAULT_FLAGS), alternated with the others."""
    from ..runtime.resources import default_threads
    if log is None:
        def log(msg, nl=True):
            print(msg, file=sys.stderr, end="\n" if nl else "", flush=True)
    threads = threads or default_threads()
    n_ctx = max(pp + tg, ctx_depth + tg) + 16
    n_ctx = (n_ctx + 255) // 256 * 256
    libs = {"ours": ours_lib_dir(ours_lib)}
    if compare_stock:
        if stock_lib:
            libs["stock"] = Path(stock_lib)
        else:
            from .stock import ensure_stock_build
            libs["stock"] = ensure_stock_build(progress=True)
    if compare_ik:
        libs[IK_ENGINE] = ik_bench.ik_bench_path(compare_ik)
        ik_argv = ik_bench.parse_flags(ik_flags)
    spec = {"model": os.path.abspath(model), "pp": pp, "tg": tg, "ctx_depth": ctx_depth, "threads": threads,
            "n_ctx": n_ctx, "seed": seed}
    per_engine_opts = {"ours": {**(opts or {}), **(ours_opts or {})}, "stock": {**(opts or {}), **(stock_opts or {})}}
    engine_spec = {e: {} for e in ("ours", "stock", MTP_ENGINE)}
    if mtp:
        libs[MTP_ENGINE] = libs["ours"]
        per_engine_opts[MTP_ENGINE] = {**per_engine_opts["ours"], "mtp": mtp}
        spec["text"] = text or MTP_TEXT
        engine_spec[MTP_ENGINE] = {"text_only": True}
    result = {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": _gguf_info(model),
              "settings": {**spec, "repeat": repeat, "warm_load": warm_load, "mtp": mtp,
                           "opts": {e: per_engine_opts[e] for e in libs if e != IK_ENGINE},
                           **({"ik_flags": ik_argv} if compare_ik else {})},
              "host": _host(), "engines": {}}
    if "stock" in libs and (libs["stock"].parent / "stock.json").is_file():
        built = json.loads((libs["stock"].parent / "stock.json").read_text())
        result["stock_build"] = {k: built[k] for k in ("variant", "cmake_flags") if k in built}
        if built.get("variant", "native") != "native":
            log(f"stock built {built['variant']}")
    if warm_cache:
        s = warm_page_cache(model)
        log(f"read {model} once into the page cache ({s:.1f} s)")
    runs: dict[str, list] = {e: [] for e in libs}

    def run(e, lib, s):
        if e == IK_ENGINE:
            return ik_bench.run_once(lib, s, ik_argv, timeout)
        return run_once(e, lib, {**s, "opts": per_engine_opts[e]}, timeout)
    if warm_load:
        result["warm_loads"] = {}
        for e, lib in libs.items():
            log(f"untimed load {e:5s} ...", nl=False)
            # ik's llama-bench has no load-only mode: a 16-token prompt and one decoded token
            res = run(e, lib, {**spec, "load_only": True, "text": None}
                      | ({"pp": 16, "tg": 1, "ctx_depth": 0} if e == IK_ENGINE else {}))
            result["warm_loads"][e] = res
            took = res.get("load_s", res.get("wall_s", 0))
            log(f" {took:.1f} s" if res.get("ok") else f" FAILED: {res.get('error')}")
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    # our own previous run keeps the 1-minute load average near `threads` for a while; above
    # the CPU count, something else is competing for the cores
    busy_at = ncpu + 0.5
    order = list(libs.items())
    for r in range(repeat):
        # flip the order every repeat, so drift in the machine's pace lands on both engines alike
        for e, lib in (order if r % 2 == 0 else order[::-1]):
            load = os.getloadavg()[0]
            if load > busy_at:
                log(f"warning: load average {load:.1f} on {ncpu} CPUs: other processes compete, "
                    f"numbers will be noisy")
            log(f"run {r + 1}/{repeat} {e:5s} ...", nl=False)
            res = run(e, lib, {**spec, **engine_spec.get(e, {})})
            res["load_avg_before"] = load
            runs[e].append(res)
            if res.get("ok"):
                msg = "".join(part for key, part in (
                    ("pp_tok_s", f" pp {res.get('pp_tok_s') or 0:.1f} tok/s,"),
                    ("tg_tok_s", f" tg {res.get('tg_tok_s') or 0:.2f} tok/s,"),
                    ("tg_depth_tok_s", f" tg@{ctx_depth} {res.get('tg_depth_tok_s') or 0:.2f} tok/s,"),
                    ("tg_text_tok_s", f" text tg {res.get('tg_text_tok_s') or 0:.2f} tok/s,"),
                    ("mtp_acceptance", f" drafts kept {100 * (res.get('mtp_acceptance') or 0):.0f}%,"))
                    if res.get(key) is not None)
                if res.get("load_s") is not None:
                    msg += f" load {res['load_s']:.1f} s,"
                msg += f" peak RSS {res['peak_rss_bytes'] / 2**30:.2f} GiB"
            else:
                msg = f" FAILED: {res.get('error')}\n    " + "\n    ".join(res.get("stderr_tail", [])[-6:])
            log(msg)
    for e, lib in libs.items():
        ok = [x for x in runs[e] if x.get("ok")]
        first = ok[0] if ok else {}
        result["engines"][e] = {
            "library_dir": str(lib), "library": first.get("library") or (str(lib) if e == IK_ENGINE else None),
            "build_info": first.get("build_info"), "ik_settings": first.get("ik_settings"),
            "patched": bool(first.get("build_info")), "amx": first.get("amx"), "flash_attn_type": first.get("flash_attn_type"),
            "n_ctx": first.get("n_ctx"), "system_info": first.get("system_info"),
            "runs": [{k: v for k, v in x.items() if k not in ("system_info", "library", "build_info", "amx")} for x in runs[e]],
            "summary": summarize(runs[e]),
        }
    for a, b in (("ours", "stock"), ("ours", IK_ENGINE), (MTP_ENGINE, "ours")):
        if a in result["engines"] and b in result["engines"]:
            sa, sb = result["engines"][a]["summary"], result["engines"][b]["summary"]
            result[f"ratios_{a.replace('+', '_')}_over_{b}"] = {m: sa[m]["median"] / sb[m]["median"]
                                                                for m in METRICS if m in sa and m in sb and sb[m]["median"]}
    if mtp:  # speculative decoding must not change the greedy tokens
        texts = {e: {tuple(r["text_tokens"]) for r in runs[e] if r.get("ok") and "text_tokens" in r}
                 for e in ("ours", MTP_ENGINE)}
        result["mtp_same_tokens"] = (len(texts["ours"] | texts[MTP_ENGINE]) == 1
                                     if texts["ours"] and texts[MTP_ENGINE] else None)
    return result


def _parse_opts(items) -> dict:
    out = {}
    for it in items or ():
        if "=" not in it:
            raise ValueError(f"--opt {it!r}: expected KEY=VALUE")
        k, v = it.split("=", 1)
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out
