"""Decode speed of two GGUFs side by side in one process, alternating short slices.

Some machines switch between decode speeds from one moment to the next (the Zen 5 guest of
docs/quantization.md: ~22 or ~30 tok/s on one file, within one process). Separate runs then
compare moments, not files. This loads both models, prefills the same 512-token prompt into
each, then decodes 16 tokens with A, 16 with B, and so on (each slice from the same cache
depth), and prints the ratio B/A of every slice pair and their median.

    python benchmarks/paired_decode.py v2-lite-q4_k_m.gguf v2-lite-ds-q4.gguf

Both models must fit in memory together.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", help="The baseline GGUF.")
    ap.add_argument("b", help="The GGUF compared with it.")
    ap.add_argument("--slices", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=16, help="Decoded tokens per slice.")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    from deepseek_cpu import Llama
    n_ctx = a.prompt + a.slices * a.tokens + 16
    models = [Llama(p, n_ctx=n_ctx, n_batch=a.prompt, n_ubatch=a.prompt, n_threads=a.threads, verbose=False)
              for p in (a.a, a.b)]
    prompt = list(range(100, 100 + a.prompt))  # the same ids in both: only the files differ
    for m in models:
        m.eval(prompt)
    rates: list[list[float]] = [[], []]
    for s in range(a.slices):
        for k, m in enumerate(models):
            m.n_tokens = a.prompt  # every slice decodes from the same depth
            t = time.perf_counter()
            for i in range(a.tokens):
                m.eval([1000 + s * a.tokens + i])
            rates[k].append(a.tokens / (time.perf_counter() - t))
        print(f"slice {s + 1:2d}: {rates[0][-1]:6.2f} {rates[1][-1]:6.2f} tok/s  ratio {rates[1][-1] / rates[0][-1]:.3f}",
              flush=True)
    ratios = [b / x for x, b in zip(*rates)]
    print(f"{Path(a.b).name} / {Path(a.a).name}: median ratio {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}); median {statistics.median(rates[0]):.2f} and "
          f"{statistics.median(rates[1]):.2f} tok/s")
    for m in models:
        m.close()


if __name__ == "__main__":
    main()
