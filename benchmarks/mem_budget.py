"""Decode under a memory limit the kernel enforces, from a cold page cache: ours with a memory
budget against stock llama-cpp-python as users run it (its default, and with its repacking off so
it maps the file) and ik_llama.cpp (mapped, with and without --prefetch-experts), interleaved.

Each run is a fresh process placed in a memory cgroup (the v1 controller at
/sys/fs/cgroup/memory; memory.limit_in_bytes caps the page cache too) before it starts, after the
page cache was dropped (/proc/sys/vm/drop_caches). Needs root. Per run: the cold start (load and
a short prompt), decode tok/s, major page faults and bytes read from the block device (per
decoded token for ours and stock; for the whole run for every engine), or "killed" when the limit
killed it. Decoded tokens are random (ours, stock) or sampled at temperature 2 (ik_llama.cpp's
llama-cli): greedy decoding of random weights repeats one token, and so one set of experts.

    python benchmarks/mem_budget.py MODEL.gguf --fractions 0.7 0.45 --rounds 2 --ik IK/build/bin --json out.json

Configurations (--configs): stock (default), stock-mapped (use_extra_bufts off), ours (default),
ours-budget-none (mem_budget, no prefetch), ours-budget-pregate (mem_budget, also the next layer's
predicted experts read ahead: DEEPSEEK_CPU_EXPERT_PREFETCH=2), ours-budget-pinned and ours-budget (mem_budget, the built-in policies; budgeted runs add their routings to the model's statistics, which later runs
use: the benchmark starts them empty, and each round has its own tokens), ik-mapped, ik-prefetch.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from deepseek_cpu.tools import bench, stock

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
SLACK = 512 << 20  # what the process needs beside the model's plan: Python, compute buffers
CONFIGS = ("stock", "stock-mapped", "ours", "ours-budget-none", "ours-budget-pregate", "ours-budget-pinned",
           "ours-budget", "ik-mapped", "ik-prefetch")
IK_TIMES = re.compile(r"(prompt eval|eval|total) time =\s*([0-9.]+) ms(?: /\s*(\d+) (?:tokens|runs))?")


def run_ik(bin_dir: Path, spec: dict, prefetch: bool, cgroup_dir: str, timeout: float) -> dict:
    """One ik_llama.cpp llama-cli run (its defaults: weights mapped, no repacking), in the cgroup.
    A random model's greedy decoding repeats one token (and so one set of experts), so it samples
    at temperature 2 instead: varied tokens, as ours and stock decode random ones. Its decode and
    prompt speeds are its own timings; major faults and bytes read cover the whole run (rusage)."""
    import resource
    prompt = "The quick brown fox jumps over the lazy dog. " * max(1, spec["pp"] // 10)
    cmd = [str(bin_dir / "llama-cli"), "-m", spec["model"], "-t", str(spec["threads"]), "-c", str(spec["n_ctx"]),
           "-p", prompt, "-n", str(spec["tg"]), "--ignore-eos", "--temp", "2", "--top-k", "0", "--top-p", "1",
           "-s", str(spec["seed"] + 1), "--no-warmup"] + (["--prefetch-experts"] if prefetch else [])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                           timeout=timeout,
                           preexec_fn=lambda: Path(cgroup_dir, "cgroup.procs").write_text(str(os.getpid())))
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    times = {m.group(1): (float(m.group(2)), int(m.group(3) or 0)) for m in IK_TIMES.finditer(p.stderr)}
    if p.returncode != 0 or "eval" not in times:
        why = " (killed: out of memory?)" if p.returncode == -9 else ""
        return {"ok": False, "error": f"llama-cli exited {p.returncode}{why}", "returncode": p.returncode,
                "stderr_tail": p.stderr.strip().splitlines()[-8:]}
    tg_ms, n = times["eval"]
    wall = time.perf_counter() - t
    faults, read = after.ru_majflt - before.ru_majflt, (after.ru_inblock - before.ru_inblock) * 512
    # llama-cli prints no load time: the process's time outside prompt and decode is counted as load
    return {"ok": True, "tg_tok_s": n / (tg_ms / 1e3), "load_s": wall - times["total"][0] / 1e3,
            "first_prefill_s": times["prompt eval"][0] / 1e3, "wall": wall,
            "run_major_faults": faults, "run_read_bytes": read, "tg": n}



def cgroup(limit: int) -> str:
    d = CGROUP_ROOT / f"dsc-membench-{os.getpid()}"
    d.mkdir(exist_ok=True)
    (d / "memory.limit_in_bytes").write_text(str(limit if limit > 0 else -1))  # -1: no limit
    try:
        (d / "memory.memsw.limit_in_bytes").write_text(str(limit))  # no swap either, where accounted
    except OSError:
        pass
    return str(d)


def drop_page_cache() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("1")


def spec_for(config: str, model: str, limit: int, args, seed: int) -> tuple[str, dict]:
    # seed: each round its own random prompt and decoded tokens, so that the statistics an
    # earlier run saved predict the model's routing, not the very tokens of the next run
    spec = {"model": model, "pp": args.pp, "tg": args.tg, "ctx_depth": 0, "n_ctx": args.ctx, "seed": seed,
            "threads": args.threads, "opts": {}, "random_decode": True}
    if config == "stock-mapped":
        spec["opts"]["use_extra_bufts"] = False
    if config.startswith("ours-budget"):
        spec["opts"]["mem_budget"] = limit - SLACK if limit > 0 else os.path.getsize(model)
        spec["opts"]["prefetch"] = {"ours-budget-none": "none", "ours-budget-pinned": "pinned"}.get(config, "popular")
    if config == "ours-budget-pregate":  # the chosen experts and the next layer's predicted ones read ahead
        spec["env"] = {"DEEPSEEK_CPU_EXPERT_PREFETCH": "2"}
    return config.split("-")[0], spec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.7, 0.45],
                    help="limits, as fractions of the file; 0: no limit (budgeted runs get the file's size)")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pp", type=int, default=16)
    ap.add_argument("--tg", type=int, default=24)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--ik", type=Path, default=None, help="ik_llama.cpp's bin directory (its llama-cli): adds "
                    "ik-mapped and ik-prefetch (--prefetch-experts) to the configurations")
    args = ap.parse_args(argv)
    args.threads = args.threads or __import__("deepseek_cpu.runtime.resources", fromlist=["x"]).default_threads()
    if os.geteuid() != 0 or not CGROUP_ROOT.is_dir():
        sys.exit("needs root and the cgroup v1 memory controller at /sys/fs/cgroup/memory")
    if not args.ik:
        args.configs = [c for c in args.configs if not c.startswith("ik-")]
    size = os.path.getsize(args.model)
    libs = {"ours": bench.ours_lib_dir(),
            "stock": stock.ensure_stock_build() if any(c.startswith("stock") for c in args.configs) else None}
    # the expert statistics start empty: budgeted runs add theirs at exit, and later runs read them
    from deepseek_cpu.runtime import prefetch
    prefetch.sidecar_path(prefetch.layout(args.model)).unlink(missing_ok=True)
    results = []
    for frac in args.fractions:
        limit = int(size * frac)
        cg = cgroup(limit)
        for rnd in range(args.rounds):
            for config in args.configs:
                engine, spec = spec_for(config, args.model, limit, args, seed=1000 * rnd + int(100 * frac))
                drop_page_cache()
                t = time.perf_counter()
                if engine == "ik":
                    r = run_ik(args.ik, spec, config == "ik-prefetch", cg, args.timeout)
                else:
                    r = bench.run_once(engine, libs[engine], spec, args.timeout, cgroup=cg)
                    if r.get("ok"):  # the same whole-run counters as ik's, for the table
                        r["run_major_faults"] = r["load_prefill_major_faults"] + r["tg_major_faults_per_token"] * args.tg
                        r["run_read_bytes"] = r["load_prefill_read_bytes"] + r["tg_read_bytes_per_token"] * args.tg
                r.update(config=config, fraction=frac, limit=limit, round=rnd, wall=time.perf_counter() - t)
                results.append(r)
                if r.get("ok"):
                    print(f"{frac:.2f}x {config:18s} round {rnd}: tg {r['tg_tok_s']:.2f} tok/s, "
                          f"cold start+prompt {r['load_s'] + r['first_prefill_s']:.1f} s, whole run "
                          f"{r['run_major_faults']:.0f} major faults, {r['run_read_bytes'] / 2**30:.2f} GiB read"
                          + (f"; decode {r['tg_major_faults_per_token']:.0f} faults and "
                             f"{r['tg_read_bytes_per_token'] / 2**20:.0f} MiB per token" if "tg_read_bytes_per_token" in r
                             else "")
                          + (f"; pre-gating hit rate {r['pregate_hit_rate']:.0%}" if r.get("pregate_hit_rate") is not None
                             else "")
                          + (f"; routing seen: top 10% of experts took {r['experts_top10pct_share']:.0%}"
                             if r.get("experts_top10pct_share") is not None else ""), flush=True)
                else:
                    print(f"{frac:.2f}x {config:17s} round {rnd}: {r.get('error')}", flush=True)
        Path(cg).rmdir() if not Path(cg, "tasks").read_text().strip() else None
    print()
    print(f"{'limit':>6s} {'config':18s} {'tg tok/s':>9s} {'cold TTFT s':>11s} {'faults/tok':>10s} {'MiB/tok':>8s} "
          f"{'run GiB read':>12s}")
    for frac in args.fractions:
        for config in args.configs:
            rs = [r for r in results if r["fraction"] == frac and r["config"] == config and r.get("ok")]
            if not rs:
                killed = any(r.get("returncode") == -9 for r in results if r["fraction"] == frac and r["config"] == config)
                print(f"{frac:5.2f}x {config:18s} {'killed' if killed else 'failed':>9s}")
                continue
            med = lambda k: statistics.median(r[k] for r in rs) if all(k in r for r in rs) else float("nan")  # noqa: E731
            print(f"{frac:5.2f}x {config:18s} {med('tg_tok_s'):9.2f} "
                  f"{statistics.median(r['load_s'] + r['first_prefill_s'] for r in rs):11.1f} "
                  f"{med('tg_major_faults_per_token'):10.0f} {med('tg_read_bytes_per_token') / 2**20:8.0f} "
                  f"{med('run_read_bytes') / 2**30:12.2f}")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "size": size, "host": bench._host(), "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
