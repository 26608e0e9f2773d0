"""A model split over 1, 2 and 3 hosts against the same model in one process, over shaped links.

Each host is a network namespace joined to this one by a veth pair (tests/rpc_hosts.py) running
`deepseek-cpu rpc-worker`; `tc netem` shapes both directions of each link (rate, one-way delay).
All workers share one weight-cache directory (entries are content-addressed), emptied before each
configuration: its first run is a first connect (weights sent) and the next ones reconnects
(hashes sent, weights read from the worker's disk). Each run is a fresh
client process: load, a prompt of --pp tokens (prefill), --tg tokens decoded one at a time, and
the bytes that crossed the links per decoded token. Needs root. One machine's CPUs serve every
host: a split model computes one host at a time (pipeline order), so this measures what the links
and the protocol cost, not more cores.

    python benchmarks/multi_host.py MODEL.gguf --hosts 1 2 3 --mem 9G 5G 3.5G \\
        --links 10gbit:0.1ms 1gbit:0.5ms --json out.json
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from rpc_hosts import Worker, hosts  # noqa: E402

PORT = 50052

CLIENT = r"""
import json, sys, time
from pathlib import Path
import numpy as np
from deepseek_cpu import Llama
spec = json.loads(sys.argv[1])
def link_bytes():
    return sum(int(Path(f"/sys/class/net/{v}/statistics/{d}_bytes").read_text()) for v in spec["veths"] for d in ("tx", "rx"))
kw = {"rpc_servers": spec["rpc"]} if spec["rpc"] else {}
rng = np.random.default_rng(spec["seed"])
l0 = link_bytes()
t0 = time.perf_counter()
llm = Llama(spec["model"], n_ctx=spec["pp"] + spec["tg"] + 8, n_batch=spec["pp"], n_ubatch=spec["pp"],
            n_threads=spec["threads"], verbose=False, **kw)
load = time.perf_counter() - t0
load_bytes = link_bytes() - l0
prompt = rng.integers(100, 50000, spec["pp"]).tolist()
import llama_cpp
def sync():  # llama-cpp-python's eval does not wait for an asynchronous backend (RPC) without logits_all
    llama_cpp.llama_synchronize(llm.ctx)
t = time.perf_counter(); llm.eval(prompt); sync(); prefill = time.perf_counter() - t
b0 = link_bytes()
t = time.perf_counter()
for tok in rng.integers(100, 50000, spec["tg"]).tolist():
    llm.eval([tok]); sync()
decode = time.perf_counter() - t
b1 = link_bytes()
print(json.dumps({"load_s": load, "load_gib_sent": load_bytes / 2**30, "prefill_tok_s": spec["pp"] / prefill, "decode_tok_s": spec["tg"] / decode,
                  "bytes_per_token": (b1 - b0) / spec["tg"]}))
"""


def run_client(spec: dict) -> dict:
    p = subprocess.run([sys.executable, "-c", CLIENT, json.dumps(spec)], capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        return {"error": p.stderr[-2000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--mem", nargs="+", default=None, help="Each worker's --mem, one per host count (default: 20G).")
    ap.add_argument("--links", nargs="+", default=["10gbit:0.1ms", "1gbit:0.5ms"], help="RATE:ONE-WAY-DELAY")
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="Reconnect runs per configuration (after the first connect).")
    ap.add_argument("--cache", type=Path, default=None, help="The workers' shared cache (default: a fresh temporary one).")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    mems = a.mem or ["20G"] * len(a.hosts)
    cache = a.cache or Path(tempfile.mkdtemp(prefix="dsc-rpc-cache-"))
    results = []

    def record(row):
        results.append(row)
        print(json.dumps(row), flush=True)
        if a.json:
            a.json.write_text(json.dumps(results, indent=1))

    base = {"model": a.model, "pp": a.pp, "tg": a.tg, "threads": a.threads, "seed": 0, "veths": []}
    for r in range(a.rounds + 1):
        record({"config": "one process", **run_client({**base, "rpc": None, "seed": r})})
    with hosts(max(a.hosts)) as hs:
        for link in a.links:
            rate, delay = link.split(":")
            shaping = {h.shape(rate, delay) for h in hs}
            print(f"link {link}: {', '.join(shaping)}", flush=True)
            for n, mem in zip(a.hosts, mems):
                for entry in cache.iterdir():  # each configuration's first run is a true first connect
                    if entry.is_file():
                        entry.unlink()
                workers = [Worker(h.addr, PORT, ["--mem", mem, "--cache", str(cache), "--threads", str(a.threads)],
                                  netns=h.name).start() for h in hs[:n]]
                spec = {**base, "rpc": ",".join(w.endpoint for w in workers), "veths": [h.veth for h in hs[:n]]}
                try:
                    for r in range(a.rounds + 1):
                        row = run_client({**spec, "seed": r})
                        record({"config": f"{n} host(s)", "link": link, "mem": mem, "shaping": sorted(shaping),
                                "connect": "first" if r == 0 else "reconnect", **row})
                finally:
                    for w in workers:
                        w.stop()
    if a.cache is None:
        shutil.rmtree(cache, ignore_errors=True)
    summarize(results)


def summarize(results):
    one = [r for r in results if r["config"] == "one process" and "decode_tok_s" in r]
    if not one:
        return
    d1 = statistics.median(r["decode_tok_s"] for r in one)
    p1 = statistics.median(r["prefill_tok_s"] for r in one)
    print(f"\n| configuration | link | decode tok/s (× one process) | prefill tok/s (× one process) | KiB per token | load: first / reconnect [s] | GiB sent: first / reconnect |")
    print("|---|---|---|---|---|---|---|")
    print(f"| one process | — | {d1:.2f} | {p1:.1f} | — | {statistics.median(r['load_s'] for r in one):.1f} | — |")
    keys = sorted({(r["config"], r["link"]) for r in results if "link" in r}, key=lambda k: (k[1], k[0]))
    for cfg, link in keys:
        rows = [r for r in results if r.get("config") == cfg and r.get("link") == link and "decode_tok_s" in r]
        if not rows:
            print(f"| {cfg} | {link} | failed | | | | |")
            continue
        d = statistics.median(r["decode_tok_s"] for r in rows)
        p = statistics.median(r["prefill_tok_s"] for r in rows)
        kib = statistics.median(r["bytes_per_token"] for r in rows) / 1024
        first = [r["load_s"] for r in rows if r["connect"] == "first"]
        again = [r["load_s"] for r in rows if r["connect"] == "reconnect"]
        loads = f"{first[0]:.1f} / {statistics.median(again):.1f}" if first and again else "—"
        sent = [r.get("load_gib_sent") for r in rows]
        gib = (f"{sent[0]:.2f} / {statistics.median(sent[1:]):.2f}" if len(sent) > 1 and None not in sent else "—")
        print(f"| {cfg} | {link} | {d:.2f} ({d / d1:.2f}×) | {p:.1f} ({p / p1:.2f}×) | {kib:.0f} | {loads} | {gib} |")


if __name__ == "__main__":
    main()
