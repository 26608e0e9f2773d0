"""Aggregate generation throughput of `deepseek-cpu serve` with 1 vs N concurrent clients.

    python benchmarks/serve_concurrency.py MODEL.gguf [--clients 1 4] [--requests 8] [--max-tokens 64]

Starts `deepseek-cpu serve MODEL --parallel max(clients)` on a free local port, then for each
client count C runs `--requests` completions (greedy, EOS suppressed so every request
generates exactly --max-tokens tokens) from C threads, and reports completion tokens per
second of wall time over all of them. With continuous batching the C requests share each
forward pass, so aggregate tokens/s grows with C until the CPU is saturated.
"""
from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def complete(url: str, prompt: str, max_tokens: int, eos: int | None) -> int:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if eos is not None:
        body["logit_bias"] = {str(eos): -100}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())["usage"]["completion_tokens"]


def run(url: str, clients: int, requests: int, max_tokens: int, eos: int | None) -> dict:
    prompts = [f"request {i}: the cat sat on the" for i in range(requests)]
    lock, done = threading.Lock(), []

    def worker():
        while True:
            with lock:
                if not prompts:
                    return
                p = prompts.pop()
            done.append(complete(url, p, max_tokens, eos))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    return {"clients": clients, "requests": len(done), "tokens": sum(done), "seconds": round(dt, 3),
            "tokens_per_s": round(sum(done) / dt, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=512, help="context per slot")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--eos", type=int, default=None, help="token id to suppress (default: from the GGUF)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    eos = a.eos
    if eos is None:
        try:
            import gguf
            f = gguf.GGUFReader(a.model, "r").fields.get("tokenizer.ggml.eos_token_id")
            eos = int(f.parts[f.data[0]][0]) if f is not None else None
        except Exception:
            eos = None

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "deepseek_cpu", "serve", a.model, "--port", str(port),
           "--parallel", str(max(a.clients)), "--ctx", str(a.ctx)]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    # the installed package (`pip install .` first)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from deepseek_cpu.runtime.serve import wait_ready
        if not wait_ready(url, proc, timeout=600):
            print("server did not start", file=sys.stderr)
            return 1
        complete(url, "warm up", 4, eos)
        rows = [run(url, c, a.requests, a.max_tokens, eos) for c in a.clients]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    if a.json:
        print(json.dumps(rows, indent=2))
    else:
        base = rows[0]["tokens_per_s"]
        print(f"{'clients':>8} {'requests':>9} {'tokens':>7} {'seconds':>8} {'tok/s':>8} {'speedup':>8}")
        for r in rows:
            print(f"{r['clients']:>8} {r['requests']:>9} {r['tokens']:>7} {r['seconds']:>8} {r['tokens_per_s']:>8} "
                  f"{r['tokens_per_s'] / base if base else 0:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
