"""`deepseek-cpu bench`: prefill / decode speed, time to first token, load time and peak
RSS of our engine, optionally side by side with stock llama.cpp (`--compare-stock`).

    deepseek-cpu bench model.gguf --pp 512 --tg 128 --repeat 3 --compare-stock --json out.json --plot out.png

Every engine run is its own child process (so peak RSS and load time are per engine and
nothing is shared but the page cache); with --compare-stock runs alternate, the order
flipping each repeat (ours, stock, stock, ours, ours, ...), and each metric is reported as
median [min-max] over the repeats, with the ratio of medians ours/stock.

Before the timed runs each engine loads the model once, untimed (--no-warm-load skips
it): the first load after the page-cache warm-up was measured to take up to 2-3x the
later ones (the kernel reclaims page cache for the new process's memory), and it would
land on whichever engine happened to run first.

One run (child process), with the llama_cpp low-level API on a context made by the
engine's `Llama` class (ours: deepseek_cpu.Llama, stock: llama_cpp.Llama), so each engine
keeps its own defaults; both get the same n_ctx, n_batch = n_ubatch = pp and threads:
  1. load: Llama(...) construction (model load, repacking, context)           -> load_s
  2. warm-up: one pp-token prefill, not timed into pp (first touches of the
     weights, thread start-up), then the cache is cleared                        -> first_prefill_s
  3. prefill: pp prompt tokens in one batch                                      -> pp_tok_s
     time to first token = that prefill + choosing the first token               -> ttft_s
  4. decode: tg tokens one at a time after the prompt (greedy)                   -> tg_tok_s
  5. with --ctx-depth D > 0: clear, fill D tokens in pp-token batches            -> fill_tok_s
     then decode tg tokens at depth D                                            -> tg_depth_tok_s
  6. peak RSS (VmHWM) of the process                                             -> peak_rss_bytes
The prompt is random token ids (fixed seed), the same for every engine.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..hookspecs import hookimpl

SCHEMA = "deepseek-cpu-bench/1"
# metric -> (label, unit, higher is better)
METRICS = {
    "pp_tok_s": ("prefill", "tok/s", True),
    "tg_tok_s": ("decode", "tok/s", True),
    "tg_depth_tok_s": ("decode at depth", "tok/s", True),
    "fill_tok_s": ("prefill to depth", "tok/s", True),
    "ttft_s": ("time to first token", "s", False),
    "first_prefill_s": ("first (cold) prefill", "s", False),
    "load_s": ("load", "s", False),
    "peak_rss_bytes": ("peak RSS", "GiB", False),
}


# ------------------------------------------------------------------------------------
# child: one engine, one run
# ------------------------------------------------------------------------------------

def _proc_status(key: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _io_counters() -> tuple[int, int]:
    """(major page faults, bytes read from block devices) of this process so far."""
    import resource
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    read = 0
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                read = int(line.split()[1])
    except OSError:
        pass
    return faults, read


def child_run(spec: dict) -> dict:
    """Runs in the child process; `spec` from the parent. Returns the run's numbers."""
    import numpy as np
    engine = spec["engine"]
    if engine == "ours":
        from deepseek_cpu.runtime.llama import Llama
    else:
        from llama_cpp import Llama
    import llama_cpp as lc
    import llama_cpp.llama_cpp as lcl

    pp, tg, depth = spec["pp"], spec["tg"], spec["ctx_depth"]
    kw = dict(n_ctx=spec["n_ctx"], n_batch=pp, n_ubatch=pp, n_threads=spec["threads"],
              n_threads_batch=spec["threads"], verbose=bool(spec.get("verbose")))
    kw.update(spec.get("opts") or {})
    # use_extra_bufts=False: llama.cpp's repacking off, for either engine: every weight used from
    # the file mapping (stock as a user with little memory runs it)
    from ..runtime.model_params import no_repacking
    placement = no_repacking() if kw.pop("use_extra_bufts", True) is False else contextlib.nullcontext()
    io0 = _io_counters()
    t0 = time.perf_counter()
    with placement:
        llm = Llama(spec["model"], **kw)
    load_s = time.perf_counter() - t0
    rss_load = _proc_status("VmRSS")
    if spec.get("load_only"):
        return {"load_s": load_s, "rss_after_load_bytes": rss_load, "peak_rss_bytes": _proc_status("VmHWM")}
    ctx = llm._ctx.ctx
    n_vocab = llm.n_vocab()
    mem = lc.llama_get_memory(ctx)

    rng = np.random.default_rng(spec.get("seed", 0))
    hi = min(n_vocab, 100000)  # plain BPE tokens of both vocabularies, no specials
    prompt = rng.integers(1000, hi, size=max(pp, depth)).tolist()
    batch = lc.llama_batch_init(max(pp, 1), 0, 1)

    def decode(tokens, pos0):
        n = len(tokens)
        batch.n_tokens = n
        for i, t in enumerate(tokens):
            batch.token[i] = t
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == n - 1
        rc = lc.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        lc.llama_synchronize(ctx)

    def argmax():
        p = lc.llama_get_logits_ith(ctx, -1)
        return int(np.ctypeslib.as_array(p, shape=(n_vocab,)).argmax())

    # Greedy decoding of random weights soon repeats one token, and then one set of experts:
    # "random_decode" feeds random tokens instead (the argmax is still computed), so that decode
    # routes as varied text would; it matters where routing decides what is read from disk.
    random_decode = bool(spec.get("random_decode"))

    def generate(pos0, n):
        times = []
        tok = argmax()
        for i in range(n):
            t = time.perf_counter()
            decode([tok], pos0 + i)
            tok = argmax()
            times.append(time.perf_counter() - t)
            if random_decode:
                tok = int(rng.integers(1000, hi))
        return times

    out: dict = {"load_s": load_s, "rss_after_load_bytes": rss_load}
    # warm-up
    t = time.perf_counter()
    decode(prompt[:pp], 0)
    out["first_prefill_s"] = time.perf_counter() - t
    lc.llama_memory_clear(mem, True)
    # prefill + time to first token
    t = time.perf_counter()
    decode(prompt[:pp], 0)
    dt = time.perf_counter() - t
    first = argmax()
    out["ttft_s"] = time.perf_counter() - t
    out["pp_tok_s"] = pp / dt
    # decode after the prompt
    io1 = _io_counters()
    times = generate(pp, tg)
    io2 = _io_counters()
    out["tg_tok_s"] = tg / sum(times)
    # what the disk gave: through load + prompt, and per decoded token (cold-cache runs)
    out["load_prefill_major_faults"], out["load_prefill_read_bytes"] = io1[0] - io0[0], io1[1] - io0[1]
    out["tg_major_faults_per_token"] = (io2[0] - io1[0]) / max(tg, 1)
    out["tg_read_bytes_per_token"] = (io2[1] - io1[1]) / max(tg, 1)
    out["tg_token_ms_median"] = statistics.median(times) * 1e3
    if depth > 0:
        lc.llama_memory_clear(mem, True)
        t = time.perf_counter()
        for s in range(0, depth, pp):
            decode(prompt[s:min(s + pp, depth)], s)
        out["fill_tok_s"] = depth / (time.perf_counter() - t)
        times = generate(depth, tg)
        out["tg_depth_tok_s"] = tg / sum(times)
    lc.llama_batch_free(batch)
    out["peak_rss_bytes"] = _proc_status("VmHWM")
    out["first_token"] = first
    if engine == "ours":  # the routing the run saw (random prompt; synth's planted skew, if any)
        try:
            usage = llm.expert_usage()
            out["experts_top10pct_share"] = float(usage.coverage(0.1).mean())
            out["experts_unused"] = int(usage.unused().sum())
        except Exception:  # a dense model, or an engine without the counters
            pass
        if getattr(llm, "memory_plan", None) is not None:  # under a budget: how well pre-gating predicted
            from ..runtime.experts import expert_prefetch_stats
            st = expert_prefetch_stats()
            out["pregate_hit_rate"] = st["chosen_predicted"] / st["chosen"] if st["chosen"] else None
    # what ran
    lib = lcl._lib
    try:
        fn = lib.deepseek_cpu_build_info
        import ctypes
        fn.restype, fn.argtypes = ctypes.c_char_p, []
        out["build_info"] = fn().decode()
    except AttributeError:
        out["build_info"] = None
    out["library"] = _loaded_libllama() or getattr(lib, "_name", "?")
    if engine == "ours":
        from ..runtime.engine import amx_status
        out["amx"] = amx_status()
    out["flash_attn_type"] = int(llm.context_params.flash_attn_type)
    out["n_ctx"] = llm.n_ctx()
    out["system_info"] = lc.llama_print_system_info().decode(errors="replace")
    return out


def _loaded_libllama() -> str | None:
    from ..runtime.engine import mapped_libllama
    return mapped_libllama()


def _child_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    try:
        res = {"ok": True, **child_run(spec)}
    except Exception as e:  # reported to the parent, which decides
        import traceback
        res = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    Path(spec["result"]).write_text(json.dumps(res))
    return 0


# ------------------------------------------------------------------------------------
# parent
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
            p = subprocess.run([sys.executable, "-m", "deepseek_cpu.tools.bench", "--child", sp],
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
    from ..runtime.engine import cpu_features
    from ..runtime.resources import available_memory
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
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
          warm_load: bool = True, log=None) -> dict:
    """Run the benchmark (see the module docstring); returns the JSON-ready result."""
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
    spec = {"model": os.path.abspath(model), "pp": pp, "tg": tg, "ctx_depth": ctx_depth, "threads": threads,
            "n_ctx": n_ctx, "seed": seed}
    per_engine_opts = {"ours": {**(opts or {}), **(ours_opts or {})}, "stock": {**(opts or {}), **(stock_opts or {})}}
    result = {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": _gguf_info(model),
              "settings": {**spec, "repeat": repeat, "warm_load": warm_load, "opts": per_engine_opts if compare_stock else
                           {"ours": per_engine_opts["ours"]}},
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
    if warm_load:
        result["warm_loads"] = {}
        for e, lib in libs.items():
            log(f"untimed load {e:5s} ...", nl=False)
            res = run_once(e, lib, {**spec, "opts": per_engine_opts[e], "load_only": True}, timeout)
            result["warm_loads"][e] = res
            log(f" {res['load_s']:.1f} s" if res.get("ok") else f" FAILED: {res.get('error')}")
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
            res = run_once(e, lib, {**spec, "opts": per_engine_opts[e]}, timeout)
            res["load_avg_before"] = load
            runs[e].append(res)
            if res.get("ok"):
                msg = (f" pp {res['pp_tok_s']:.1f} tok/s, tg {res['tg_tok_s']:.2f} tok/s"
                       + (f", tg@{ctx_depth} {res['tg_depth_tok_s']:.2f} tok/s" if ctx_depth else "")
                       + f", load {res['load_s']:.1f} s, peak RSS {res['peak_rss_bytes'] / 2**30:.2f} GiB")
            else:
                msg = f" FAILED: {res.get('error')}\n    " + "\n    ".join(res.get("stderr_tail", [])[-6:])
            log(msg)
    for e, lib in libs.items():
        ok = [x for x in runs[e] if x.get("ok")]
        first = ok[0] if ok else {}
        result["engines"][e] = {
            "library_dir": str(lib), "library": first.get("library"), "build_info": first.get("build_info"),
            "patched": bool(first.get("build_info")), "amx": first.get("amx"), "flash_attn_type": first.get("flash_attn_type"),
            "n_ctx": first.get("n_ctx"), "system_info": first.get("system_info"),
            "runs": [{k: v for k, v in x.items() if k not in ("system_info", "library", "build_info", "amx")} for x in runs[e]],
            "summary": summarize(runs[e]),
        }
    if compare_stock:
        so, ss = result["engines"]["ours"]["summary"], result["engines"]["stock"]["summary"]
        result["ratios_ours_over_stock"] = {m: so[m]["median"] / ss[m]["median"]
                                            for m in METRICS if m in so and m in ss and ss[m]["median"]}
    return result


# ------------------------------------------------------------------------------------
# reporting
# ------------------------------------------------------------------------------------

def _fmt(m: str, v: float) -> str:
    if m == "peak_rss_bytes":
        return f"{v / 2**30:.2f}"
    if m.endswith("_s") and not m.endswith("tok_s"):
        return f"{v:.2f}"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def metric_label(m: str, settings: dict) -> str:
    label, unit, _ = METRICS[m]
    pp, tg, d = settings["pp"], settings["tg"], settings["ctx_depth"]
    label = {"pp_tok_s": f"pp{pp}", "tg_tok_s": f"tg{tg} after {pp}", "tg_depth_tok_s": f"tg{tg} at depth {d}",
             "fill_tok_s": f"prefill 0..{d}", "ttft_s": f"TTFT ({pp}-token prompt)"}.get(m, label)
    return f"{label} [{unit}]"


def format_table(result: dict) -> str:
    engines = list(result["engines"])
    st = result["settings"]
    rows = [["metric"] + [f"{e} median [min-max]" for e in engines] + (["ours/stock"] if "stock" in engines else [])]
    for m in METRICS:
        cells = []
        for e in engines:
            s = result["engines"][e]["summary"].get(m)
            cells.append(f"{_fmt(m, s['median'])} [{_fmt(m, s['min'])}-{_fmt(m, s['max'])}]" if s else "-")
        if all(c == "-" for c in cells):
            continue
        row = [metric_label(m, st)] + cells
        if "stock" in engines:
            r = result.get("ratios_ours_over_stock", {}).get(m)
            row.append(f"{r:.2f}x" if r else "-")
        rows.append(row)
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in rows]
    lines.insert(1, "  ".join("-" * x for x in w))
    shares = [x["experts_top10pct_share"] for x in result["engines"].get("ours", {}).get("runs", [])
              if "experts_top10pct_share" in x]
    if shares:  # what the random prompt's routing looked like (uniform: 10%)
        lines.append(f"routing: the most used 10% of each layer's experts took {100 * statistics.median(shares):.1f}% "
                     "of its routings (uniform: 10%; deepseek-cpu experts shows more)")
    return "\n".join(lines)


def plot(result: dict, out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    engines = list(result["engines"])
    st = result["settings"]
    speed = [m for m in ("pp_tok_s", "tg_tok_s", "tg_depth_tok_s") if any(m in result["engines"][e]["summary"] for e in engines)]
    other = [m for m in ("ttft_s", "load_s", "peak_rss_bytes") if any(m in result["engines"][e]["summary"] for e in engines)]
    fig, axes = plt.subplots(1, len(speed) + len(other), figsize=(3.0 * (len(speed) + len(other)), 4.2))
    colors = {"ours": "#2b7bba", "stock": "#999999"}
    for ax, m in zip(axes, speed + other):
        meds, lo, hi = [], [], []
        for e in engines:
            s = result["engines"][e]["summary"].get(m)
            k = 2**30 if m == "peak_rss_bytes" else 1
            meds.append(s["median"] / k if s else 0)
            lo.append((s["median"] - s["min"]) / k if s else 0)
            hi.append((s["max"] - s["median"]) / k if s else 0)
        ax.bar(engines, meds, yerr=[lo, hi], capsize=4, color=[colors.get(e, "#555") for e in engines])
        ax.set_title(metric_label(m, st), fontsize=9)
        for i, v in enumerate(meds):
            ax.text(i, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
        r = result.get("ratios_ours_over_stock", {}).get(m)
        if r:
            ax.set_xlabel(f"ours/stock {r:.2f}x", fontsize=8)
    name = result["model"].get("name") or Path(result["model"]["path"]).name
    fig.suptitle(f"{name} ({Path(result['model']['path']).name}, {result['model']['size_bytes'] / 2**30:.2f} GiB), "
                 f"{st['threads']} threads, median of {st['repeat']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


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


@hookimpl
def deepseek_cpu_register_commands(cli):
    import click

    @cli.command("bench")
    @click.argument("model", type=click.Path(exists=True, dir_okay=False))
    @click.option("--pp", default=512, show_default=True, help="Prompt tokens (one batch; n_batch = n_ubatch = pp).")
    @click.option("--tg", default=128, show_default=True, help="Tokens generated one by one.")
    @click.option("--threads", type=int, default=None, help="Threads for both engines (default: physical cores).")
    @click.option("--repeat", default=3, show_default=True, help="Runs per engine (interleaved with stock).")
    @click.option("--ctx-depth", default=4096, show_default=True,
                  help="Also decode with this many tokens in the cache (0: skip).")
    @click.option("--compare-stock", is_flag=True,
                  help="Also run stock llama.cpp (llama-cpp-python 0.3.36 without our patches; built once, cached).")
    @click.option("--flash-attn", type=click.Choice(["default", "on", "off"]), default="default", show_default=True,
                  help="flash_attn for both engines (default: each engine's own default).")
    @click.option("--opt", "opts", multiple=True, metavar="KEY=VALUE",
                  help="Extra Llama() argument for both engines (VALUE parsed as JSON), e.g. --opt use_mmap=false.")
    @click.option("--mem-budget", default=None, metavar="SIZE",
                  help="Ours under a memory budget (Llama(mem_budget=SIZE)); for stock, --stock-opt use_extra_bufts=false "
                       "maps its weights too. benchmarks/mem_budget.py runs both under a real memory limit.")
    @click.option("--rpc", "rpc_servers", default=None, metavar="HOST:PORT,...",
                  help="Ours split over these `deepseek-cpu rpc-worker`s (Llama(rpc_servers=...)); "
                       "benchmarks/multi_host.py runs them as separate hosts over shaped links.")
    @click.option("--ours-opt", multiple=True, metavar="KEY=VALUE", help="Extra Llama() argument for ours only.")
    @click.option("--stock-opt", multiple=True, metavar="KEY=VALUE", help="Extra Llama() argument for stock only.")
    @click.option("--ours-lib", type=click.Path(file_okay=False), default=None,
                  help="Directory of our libllama.so (default: the installed engine).")
    @click.option("--stock-lib", type=click.Path(file_okay=False), default=None,
                  help="Directory of a stock libllama.so to use instead of the cached build.")
    @click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Write all results here.")
    @click.option("--plot", "plot_out", type=click.Path(dir_okay=False), default=None,
                  help="Write a PNG bar chart here (needs matplotlib: pip install 'deepseek-cpu[bench]').")
    @click.option("--seed", default=0, show_default=True, help="Seed of the random prompt.")
    @click.option("--timeout", default=3600.0, show_default=True, help="Seconds allowed per run.")
    @click.option("--no-warm-cache", is_flag=True, help="Do not read the model into the page cache first.")
    @click.option("--no-warm-load", is_flag=True,
                  help="Skip the untimed first load of each engine (that load pays for page-cache reclaim).")
    def bench_cmd(model, pp, tg, threads, repeat, ctx_depth, compare_stock, flash_attn, opts, mem_budget, rpc_servers, ours_opt,
                  stock_opt, ours_lib, stock_lib, json_out, plot_out, seed, timeout, no_warm_cache,
                  no_warm_load):
        """Prefill/decode tok/s, time to first token, load time and peak RSS of MODEL (a GGUF).

        Each run is a fresh process; with --compare-stock, ours and stock alternate and the
        table shows median [min-max] and the ratio ours/stock. Never a pass/fail test."""
        if pp < 1 or tg < 1 or repeat < 1 or ctx_depth < 0:
            raise click.BadParameter("--pp, --tg and --repeat must be positive, --ctx-depth >= 0")
        if plot_out:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise click.ClickException("--plot needs matplotlib: pip install 'deepseek-cpu[bench]'") from None
        try:
            common = _parse_opts(opts)
            if flash_attn != "default":
                common["flash_attn"] = flash_attn == "on"
            res = bench(model, pp=pp, tg=tg, threads=threads, repeat=repeat, ctx_depth=ctx_depth,
                        compare_stock=compare_stock, opts=common,
                        ours_opts={**({"mem_budget": mem_budget} if mem_budget else {}),
                                   **({"rpc_servers": rpc_servers} if rpc_servers else {}), **_parse_opts(ours_opt)},
                        stock_opts=_parse_opts(stock_opt), ours_lib=ours_lib, stock_lib=stock_lib, seed=seed,
                        timeout=timeout, warm_cache=not no_warm_cache, warm_load=not no_warm_load,
                        log=lambda m, nl=True: click.echo(m, err=True, nl=nl))
        except (ValueError, FileNotFoundError) as e:
            raise click.ClickException(str(e)) from None
        except Exception as e:
            from .stock import StockBuildError
            if isinstance(e, StockBuildError):
                raise click.ClickException(str(e)) from None
            raise
        click.echo(format_table(res))
        for e, d in res["engines"].items():
            click.echo(f"{e}: {d['library']} ({'patched: ' + d['build_info'] if d['patched'] else 'not patched'})"
                       + (f", AMX {d['amx']}" if d.get("amx") else ""))
        if json_out:
            Path(json_out).write_text(json.dumps(res, indent=2))
            click.echo(f"wrote {json_out}")
        if plot_out:
            plot(res, plot_out)
            click.echo(f"wrote {plot_out}")
        failed = [e for e, d in res["engines"].items() if not any(r.get("ok") for r in d["runs"])]
        if failed:
            raise click.ClickException(f"every run of {', '.join(failed)} failed (see above)")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(_child_main(sys.argv[2]))
    print("internal entry point of `deepseek-cpu bench`", file=sys.stderr)
    sys.exit(2)
