"""A/B prefill timing of two engine builds on one GGUF, alternated process by process.

Patch headers quote "old and new libraries alternated" numbers; this is the script that takes
them. Each run is a fresh process that loads MODEL with the libraries in one directory
(LLAMA_CPP_LIB_PATH), warms up with one batch, then times `--reps` prefills of `--pp` tokens
(random ids, fixed seed, cache cleared before each), flash attention off unless
`--flash-attn` says otherwise. Runs alternate A, B, A, B, ... so slow
minutes of a shared machine hit both sides.

    python benchmarks/ab_prefill.py MODEL.gguf LIBDIR_A LIBDIR_B --pairs 3 --reps 3
    python benchmarks/ab_prefill.py MODEL.gguf LIB LIB --env-b SOME_SWITCH=1   # one build, a switch

Prints each run's timings and, per side, the median and range of all timed prefills, and the
ratio B/A of the medians. Copy a build's lib/ aside first (`cp -r .venv/.../deepseek_cpu/lib
/tmp/lib-old`) to keep it as side A while B is rebuilt.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
import numpy as np
import llama_cpp as lc
model, pp, reps, threads, fa = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
lc.llama_backend_init()
mp = lc.llama_model_default_params()
m = lc.llama_model_load_from_file(model.encode(), mp)
if not m:
    sys.exit("load failed")
cp = lc.llama_context_default_params()
cp.n_ctx = cp.n_batch = cp.n_ubatch = pp
cp.n_threads = cp.n_threads_batch = threads
cp.flash_attn_type = fa
ctx = lc.llama_init_from_model(m, cp)
mem = lc.llama_get_memory(ctx)
rng = np.random.default_rng(0)
toks = rng.integers(1000, 100000, size=pp).tolist()
batch = lc.llama_batch_init(pp, 0, 1)
batch.n_tokens = pp
for i, t in enumerate(toks):
    batch.token[i] = t; batch.pos[i] = i; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = 0
    batch.logits[i] = i == pp - 1
out = []
for r in range(reps + 1):
    lc.llama_memory_clear(mem, True)
    t = time.perf_counter()
    if lc.llama_decode(ctx, batch) != 0:
        sys.exit("decode failed")
    lc.llama_synchronize(ctx)
    if r:  # the first prefill warms up (page faults, thread start) and is not counted
        out.append(pp / (time.perf_counter() - t))
print(json.dumps(out))
"""


FLASH_ATTN = {"off": 0, "on": 1, "auto": -1}  # llama_flash_attn_type


def run(model: str, lib: str, pp: int, reps: int, threads: int, fa: str, extra: list[str] = ()) -> list[float]:
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=lib, **dict(kv.split("=", 1) for kv in extra))
    r = subprocess.run([sys.executable, "-c", CHILD, model, str(pp), str(reps), str(threads),
                        str(FLASH_ATTN[fa])],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"run with {lib} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("lib_a")
    ap.add_argument("lib_b")
    ap.add_argument("--env-a", action="append", default=[], metavar="NAME=VALUE", help="environment of side A")
    ap.add_argument("--env-b", action="append", default=[], metavar="NAME=VALUE", help="environment of side B")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3, help="timed prefills per process")
    ap.add_argument("--pairs", type=int, default=3, help="A/B process pairs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flash-attn", choices=sorted(FLASH_ATTN), default="off",
                    help="off is what deepseek_cpu.Llama and llama_cpp.Llama default to")
    a = ap.parse_args()
    res: dict[str, list[float]] = {"A": [], "B": []}
    for i in range(a.pairs):
        for side, lib, extra in (("A", a.lib_a, a.env_a), ("B", a.lib_b, a.env_b)):
            t0 = time.perf_counter()
            v = run(a.model, lib, a.pp, a.reps, a.threads, a.flash_attn, extra)
            res[side] += v
            print(f"pair {i + 1} {side}: " + " ".join(f"{x:.2f}" for x in v)
                  + f" tok/s ({time.perf_counter() - t0:.0f} s)", flush=True)
    med = {s: statistics.median(v) for s, v in res.items()}
    for s, lib in (("A", a.lib_a), ("B", a.lib_b)):
        print(f"{s} {lib}: median {med[s]:.2f} [{min(res[s]):.2f}-{max(res[s]):.2f}] tok/s")
    print(f"B/A {med['B'] / med['A']:.4f}")


if __name__ == "__main__":
    main()
