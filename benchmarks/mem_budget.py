"""Decode under a memory limit the kernel enforces, from a cold page cache: ours with a memory
budget against stock llama-cpp-python as users run it (its default, and with its repacking off so
it maps the file), interleaved.

Each run is a fresh process placed in a memory cgroup (the v1 controller at
/sys/fs/cgroup/memory; memory.limit_in_bytes caps the page cache too) before it starts, after the
page cache was dropped (/proc/sys/vm/drop_caches). Needs root. Per run: time to first token of a
short prompt (load included: the cold start), decode tok/s, major page faults and bytes read from
the block device per decoded token, or "killed" when the limit killed it.

    python benchmarks/mem_budget.py MODEL.gguf --fractions 0.7 0.45 --rounds 2 --json out.json

Configurations (--configs): stock (default), stock-mapped (use_extra_bufts off), ours (default),
ours-budget-none (mem_budget, no prefetch), ours-budget (mem_budget, the built-in prefetch policy;
its first run at each fraction also records expert statistics, which the next runs use).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from deepseek_cpu.tools import bench, stock

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
SLACK = 512 << 20  # what the process needs beside the model's plan: Python, compute buffers
CONFIGS = ("stock", "stock-mapped", "ours", "ours-budget-none", "ours-budget-pinned", "ours-budget")


def cgroup(limit: int) -> str:
    d = CGROUP_ROOT / f"dsc-membench-{os.getpid()}"
    d.mkdir(exist_ok=True)
    (d / "memory.limit_in_bytes").write_text(str(limit))
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
        spec["opts"]["mem_budget"] = limit - SLACK
        spec["opts"]["prefetch"] = {"ours-budget-none": "none", "ours-budget-pinned": "pinned"}.get(config, "popular")
    return ("stock" if config.startswith("stock") else "ours"), spec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.7, 0.45], help="limits, as fractions of the file")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pp", type=int, default=16)
    ap.add_argument("--tg", type=int, default=24)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    args.threads = args.threads or __import__("deepseek_cpu.runtime.resources", fromlist=["x"]).default_threads()
    if os.geteuid() != 0 or not CGROUP_ROOT.is_dir():
        sys.exit("needs root and the cgroup v1 memory controller at /sys/fs/cgroup/memory")
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
                r = bench.run_once(engine, libs[engine], spec, args.timeout, cgroup=cg)
                r.update(config=config, fraction=frac, limit=limit, round=rnd, wall=time.perf_counter() - t)
                results.append(r)
                if r.get("ok"):
                    print(f"{frac:.2f}x {config:17s} round {rnd}: tg {r['tg_tok_s']:.2f} tok/s, "
                          f"cold start+prompt {r['load_s'] + r['first_prefill_s']:.1f} s, "
                          f"{r['tg_major_faults_per_token']:.0f} major faults and "
                          f"{r['tg_read_bytes_per_token'] / 2**20:.0f} MiB read per token", flush=True)
                else:
                    print(f"{frac:.2f}x {config:17s} round {rnd}: {r.get('error')}", flush=True)
        Path(cg).rmdir() if not Path(cg, "tasks").read_text().strip() else None
    print()
    print(f"{'limit':>6s} {'config':17s} {'tg tok/s':>9s} {'cold TTFT s':>11s} {'faults/tok':>10s} {'MiB/tok':>8s}")
    for frac in args.fractions:
        for config in args.configs:
            rs = [r for r in results if r["fraction"] == frac and r["config"] == config and r.get("ok")]
            if not rs:
                print(f"{frac:5.2f}x {config:17s} {'killed' if any(r.get('returncode') == -9 for r in results if r['fraction'] == frac and r['config'] == config) else 'failed':>9s}")
                continue
            med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
            print(f"{frac:5.2f}x {config:17s} {med('tg_tok_s'):9.2f} {statistics.median(r['load_s'] + r['first_prefill_s'] for r in rs):11.1f} "
                  f"{med('tg_major_faults_per_token'):10.0f} {med('tg_read_bytes_per_token') / 2**20:8.0f}")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "size": size, "host": bench._host(), "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
