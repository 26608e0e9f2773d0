"""Prefill and decode speed of each quantization scheme on DeepSeek-V2-Lite's shapes.

A mix is only useful if each of its tensor types runs on our fast kernels. This writes a
random-weight GGUF with V2-Lite's exact shapes per scheme (`deepseek-cpu synth`, the types
llama.cpp's quantizer would give), then runs `deepseek-cpu bench` on them in interleaved
rounds (scheme A, B, C, ..., A, B, C, ...) so that slow minutes of a shared machine hit every
scheme. Prints median tok/s and the ratio to the first scheme (default q4_k_m). Where decode
speed jumps from moment to moment, compare two files with benchmarks/paired_decode.py.

    python benchmarks/schemes_speed.py --dir /tmp/schemes --rounds 3
    python benchmarks/schemes_speed.py --layers 8 --schemes q4_k_m,ds-q4 --rounds 2
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schemes", default="q4_k_m,ds-q4,ds-q4-q8,ds-q4-k,ds-q4-lean,q4_0")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="Where the synthetic GGUFs go (kept).")
    ap.add_argument("--layers", type=int, default=None, help="Keep the first N blocks (default: all 27).")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="Write every run's numbers here.")
    a = ap.parse_args()
    schemes = a.schemes.split(",")
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    tag = f"v2-lite{f'-L{a.layers}' if a.layers else ''}"
    models = {}
    for s in schemes:
        m = d / f"{tag}-{s}.gguf"
        if not m.exists():
            cmd = ["deepseek-cpu", "synth", str(m), "--shape", "v2-lite", "--quant", s, "--quiet"]
            subprocess.run(cmd + (["--layers", str(a.layers)] if a.layers else []), check=True)
        models[s] = m
    runs: dict[str, list[dict]] = {s: [] for s in schemes}
    for r in range(a.rounds):
        for s in schemes:
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                subprocess.run(["deepseek-cpu", "bench", str(models[s]), "--pp", str(a.pp), "--tg", str(a.tg),
                                "--repeat", "1", "--ctx-depth", "0", "--threads", str(a.threads),
                                "--json", f.name], check=True, stdout=subprocess.DEVNULL)
                res = json.loads(Path(f.name).read_text())
            one = res["engines"]["ours"]["runs"][0]
            runs[s].append({"pp_tok_s": one["pp_tok_s"], "tg_tok_s": one["tg_tok_s"]})
            print(f"round {r + 1} {s:<12} pp{a.pp} {one['pp_tok_s']:7.1f}  tg{a.tg} {one['tg_tok_s']:6.2f} tok/s",
                  file=sys.stderr)
    med = {s: {k: statistics.median(x[k] for x in runs[s]) for k in ("pp_tok_s", "tg_tok_s")} for s in schemes}
    ref = med[schemes[0]]
    print(f"| scheme | size GiB | pp{a.pp} tok/s | vs {schemes[0]} | tg{a.tg} tok/s | vs {schemes[0]} |")
    print("|---|---|---|---|---|---|")
    for s in schemes:
        m = med[s]
        print(f"| {s} | {models[s].stat().st_size / 2**30:.2f} | {m['pp_tok_s']:.1f} | "
              f"{m['pp_tok_s'] / ref['pp_tok_s']:.3f} | {m['tg_tok_s']:.2f} | {m['tg_tok_s'] / ref['tg_tok_s']:.3f} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"settings": vars(a), "runs": runs, "median": med}, indent=2))


if __name__ == "__main__":
    main()
