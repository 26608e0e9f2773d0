"""Bytes of weights a DeepSeek GGUF reads per decoded token (the decode roofline's numerator).

Every tensor is read once per token except the token embedding (one row) and the routed
experts (n_expert_used of n_expert). Divide the streaming read bandwidth
(benchmarks/membw.c) by this to get the roofline in tokens/s.

    python benchmarks/bytes_per_token.py v2-lite-q4_0.gguf [--bandwidth 22.3]
"""
import argparse

import gguf


def bytes_per_token(path: str) -> tuple[int, float]:
    r = gguf.GGUFReader(path)
    arch = bytes(r.get_field("general.architecture").parts[-1]).decode()
    used = int(r.get_field(f"{arch}.expert_used_count").parts[-1][0])
    total_experts = int(r.get_field(f"{arch}.expert_count").parts[-1][0])
    file_bytes, per_token = 0, 0.0
    for t in r.tensors:
        n = int(t.n_bytes)
        file_bytes += n
        if "_exps" in t.name:
            per_token += n * used / total_experts
        elif t.name != "token_embd.weight":
            per_token += n
    return file_bytes, per_token


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--bandwidth", type=float, help="streaming read GB/s (benchmarks/membw.c)")
    a = ap.parse_args()
    file_bytes, per_token = bytes_per_token(a.model)
    print(f"tensors {file_bytes / 1e9:.2f} GB; read per decoded token {per_token / 1e9:.3f} GB")
    if a.bandwidth:
        print(f"decode roofline at {a.bandwidth} GB/s: {a.bandwidth * 1e9 / per_token:.1f} tok/s")


if __name__ == "__main__":
    main()
