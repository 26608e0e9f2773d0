"""Load time and time to first token of several engine configurations, cold or warm, alternated.

A side is `LABEL=LIBDIR[,KEY=VALUE...]`: a library directory (LLAMA_CPP_LIB_PATH; `-` for the
installed engine) and environment settings; `mapped=1` among them loads with
use_extra_bufts=false (every weight used from the file mapping, nothing repacked: stock's fastest
load). Each run is a fresh process that loads MODEL, then evaluates a `--prompt`-token prompt: it
prints the load's seconds and the time to the first token's logits (load + prompt). With --cold,
the page cache is dropped before every run (needs root). Runs alternate side by side, so slow
minutes of a shared machine hit every side.

    python benchmarks/load_time.py MODEL.gguf --cold --reps 3 \\
        ours=- ours-cache=-,DEEPSEEK_CPU_REPACK_CACHE=/tmp/rc \\
        stock=~/.cache/deepseek-cpu/stock-<commit>/lib stock-mapped=~/.cache/deepseek-cpu/stock-<commit>/lib,mapped=1

A side with DEEPSEEK_CPU_REPACK_CACHE gets one untimed load first (which writes the cache).
Prints each run, then per side the median [min-max], and the ratios to the first side;
--json writes everything.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import llama_cpp as lc
model, n_prompt, threads, mapped = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
lc.llama_backend_init()
mp = lc.llama_model_default_params()
if mapped:
    mp.use_extra_bufts = False
t1 = time.perf_counter()
m = lc.llama_model_load_from_file(model.encode(), mp)
if not m:
    sys.exit("load failed")
t2 = time.perf_counter()
cp = lc.llama_context_default_params()
cp.n_ctx = n_prompt + 16
cp.n_batch = cp.n_ubatch = n_prompt
cp.n_threads = cp.n_threads_batch = threads
ctx = lc.llama_init_from_model(m, cp)
n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(m))
batch = lc.llama_batch_init(n_prompt, 0, 1)
for i in range(n_prompt):
    batch.token[i] = (i * 7919 + 13) % n_vocab
    batch.pos[i] = i
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = 0
    batch.logits[i] = i == n_prompt - 1
batch.n_tokens = n_prompt
assert lc.llama_decode(ctx, batch) == 0
t3 = time.perf_counter()
print(json.dumps({"load_s": t2 - t1, "ttft_s": t3 - t1, "import_s": t1 - t0}))
"""


def parse_side(text: str) -> tuple[str, str | None, dict[str, str]]:
    label, _, rest = text.partition("=")
    parts = rest.split(",")
    lib = None if parts[0] in ("-", "") else os.path.expanduser(parts[0])
    env = dict(p.split("=", 1) for p in parts[1:] if p)
    return label, lib, env


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def run(model: str, lib: str | None, env: dict[str, str], n_prompt: int, threads: int) -> dict:
    e = {**os.environ, **{k: v for k, v in env.items() if k != "mapped"}}
    if lib:
        e["LLAMA_CPP_LIB_PATH"] = lib
    out = subprocess.run([sys.executable, "-c", CHILD, model, str(n_prompt), str(threads), env.get("mapped", "0")],
                         env=e, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"run failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("sides", nargs="+", help="LABEL=LIBDIR[,KEY=VALUE...]")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--cold", action="store_true", help="drop the page cache before every run (root)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    sides = [parse_side(s) for s in a.sides]
    for label, lib, env in sides:
        if env.get("DEEPSEEK_CPU_REPACK_CACHE"):
            run(a.model, lib, env, a.prompt, a.threads)  # writes the cache
    results: dict[str, list[dict]] = {label: [] for label, _, _ in sides}
    for rep in range(a.reps):
        for label, lib, env in sides:
            if a.cold:
                drop_caches()
            r = run(a.model, lib, env, a.prompt, a.threads)
            results[label].append(r)
            print(f"rep {rep} {label:>14}: load {r['load_s']:6.2f} s  ttft {r['ttft_s']:6.2f} s", flush=True)
    base = sides[0][0]
    print(f"\n{'side':>14}  {'load s':>22}  {'ttft s':>22}  load/{base}  ttft/{base}")
    summary = {}
    for label, _, _ in sides:
        ls = [r["load_s"] for r in results[label]]
        ts = [r["ttft_s"] for r in results[label]]
        summary[label] = {"load_s": statistics.median(ls), "ttft_s": statistics.median(ts)}
        b = summary.get(base, summary[label])
        print(f"{label:>14}  {statistics.median(ls):6.2f} [{min(ls):.2f}-{max(ls):.2f}]  "
              f"{statistics.median(ts):6.2f} [{min(ts):.2f}-{max(ts):.2f}]  "
              f"{summary[label]['load_s'] / b['load_s']:8.2f}  {summary[label]['ttft_s'] / b['ttft_s']:8.2f}")
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump({"model": a.model, "cold": a.cold, "reps": a.reps, "prompt": a.prompt, "threads": a.threads,
                       "sides": {label: {"lib": lib, "env": env} for label, lib, env in sides},
                       "runs": results, "median": summary}, f, indent=1)
        os.replace(a.json + ".tmp", a.json)


if __name__ == "__main__":
    main()
