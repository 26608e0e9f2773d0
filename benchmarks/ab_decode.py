"""A/B decode timing of two engine configurations on one GGUF, alternated process by process.

A side is a library directory (LLAMA_CPP_LIB_PATH; default: the installed engine) plus
environment settings, so one build can be compared with itself under a switch
(`--env-a DEEPSEEK_CPU_MQA_FA=0`) as well as with another build (`--lib-a /tmp/lib-old`).
Each run is a fresh process that loads MODEL, prefills `--depth` random tokens once, then
decodes `--tg` tokens one llama_decode at a time, `--reps` times, each time from the same
depth (the decoded tokens are removed from the cache in between, where the cache can drop them). Runs alternate A, B, A, B,
... so slow minutes of a shared machine hit both sides.

    python benchmarks/ab_decode.py MODEL.gguf --depth 512 --tg 64 --pairs 3 \\
        --env-a DEEPSEEK_CPU_MQA_FA=0

Prints each run's decode rates and, per side, the median and range, and the ratio B/A.
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
model, depth, tg, reps, threads, fa = sys.argv[1], *map(int, sys.argv[2:7])
lc.llama_backend_init()
m = lc.llama_model_load_from_file(model.encode(), lc.llama_model_default_params())
if not m:
    sys.exit("load failed")
cp = lc.llama_context_default_params()
cp.n_ctx = depth + (reps + 1) * tg + 16
cp.n_batch = cp.n_ubatch = min(512, max(depth, 1))
cp.n_threads = cp.n_threads_batch = threads
cp.flash_attn_type = fa
ctx = lc.llama_init_from_model(m, cp)
mem = lc.llama_get_memory(ctx)
rng = np.random.default_rng(0)
batch = lc.llama_batch_init(cp.n_batch, 0, 1)

def decode(tokens, p0):
    batch.n_tokens = len(tokens)
    for i, t in enumerate(tokens):
        batch.token[i] = int(t); batch.pos[i] = p0 + i; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = 0
        batch.logits[i] = i == len(tokens) - 1
    if lc.llama_decode(ctx, batch) != 0:
        sys.exit("decode failed")

prompt = rng.integers(1000, 100000, size=depth)
for p0 in range(0, depth, cp.n_batch):
    decode(prompt[p0:p0 + cp.n_batch], p0)
out = []
pos = depth
for r in range(reps + 1):
    # a cache that cannot drop tokens (DeepSeek-V4's compressed attention) decodes on from where the
    # last run ended: runs are then tg tokens deeper each
    if lc.llama_memory_seq_rm(mem, 0, depth, -1):
        pos = depth
    toks = rng.integers(1000, 100000, size=tg)
    t = time.perf_counter()
    for j in range(tg):
        decode(toks[j:j + 1], pos + j)
    pos += tg
    lc.llama_synchronize(ctx)
    if r:  # the first run warms up and is not counted
        out.append(tg / (time.perf_counter() - t))
print(json.dumps(out))
"""

# the llama_flash_attn_type values, shared with the prefill A/B (this directory is on sys.path
# when the script runs)
from ab_prefill import FLASH_ATTN  # noqa: E402


def parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--env-a/--env-b take NAME=VALUE, got {item!r}")
        env[key] = value
    return env


def run(a: argparse.Namespace, lib: str | None, extra: dict[str, str]) -> list[float]:
    env = dict(os.environ, **extra)
    if lib:
        env["LLAMA_CPP_LIB_PATH"] = lib
    r = subprocess.run([sys.executable, "-c", CHILD, a.model, str(a.depth), str(a.tg), str(a.reps),
                        str(a.threads), str(FLASH_ATTN[a.flash_attn])],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"run with {lib or 'the installed engine'} {extra} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--lib-a", help="library directory of side A (default: the installed engine)")
    ap.add_argument("--lib-b", help="library directory of side B (default: the installed engine)")
    ap.add_argument("--env-a", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--env-b", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--depth", type=int, default=512, help="tokens in the cache before decoding")
    ap.add_argument("--tg", type=int, default=64, help="tokens decoded per timed run")
    ap.add_argument("--reps", type=int, default=2, help="timed decode runs per process")
    ap.add_argument("--pairs", type=int, default=3, help="A/B process pairs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flash-attn", choices=sorted(FLASH_ATTN), default="off",
                    help="off is what deepseek_cpu.Llama and llama_cpp.Llama default to")
    a = ap.parse_args()
    sides = {"A": (a.lib_a, parse_env(a.env_a)), "B": (a.lib_b, parse_env(a.env_b))}
    if sides["A"] == sides["B"]:
        raise SystemExit("sides A and B are the same configuration")
    res: dict[str, list[float]] = {"A": [], "B": []}
    for i in range(a.pairs):
        for side, (lib, env) in sides.items():
            t0 = time.perf_counter()
            v = run(a, lib, env)
            res[side] += v
            print(f"pair {i + 1} {side}: " + " ".join(f"{x:.2f}" for x in v)
                  + f" tok/s ({time.perf_counter() - t0:.0f} s)", flush=True)
    med = {s: statistics.median(v) for s, v in res.items()}
    for s, (lib, env) in sides.items():
        what = " ".join([lib or "installed engine"] + [f"{k}={v}" for k, v in env.items()])
        print(f"{s} {what}: median {med[s]:.2f} [{min(res[s]):.2f}-{max(res[s]):.2f}] tok/s")
    print(f"B/A {med['B'] / med['A']:.4f}")


if __name__ == "__main__":
    main()
