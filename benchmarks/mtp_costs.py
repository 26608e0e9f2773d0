"""What one MTP speculative step costs, against one plain decode step (issue 49).

    python benchmarks/mtp_costs.py MODEL.gguf [--depth 512] [--repeat 15] [--json out.json]

MODEL must hold an MTP layer (`deepseek-cpu synth --shape v3 --layers 4` writes V3's, real
shapes, random weights). In one process, at the same context depth, interleaved:
  - decode of 1, 2 and 3 tokens in one batch (logits for every row, as a verify step computes
    them), the cache put back after each: t1, t2, t3;
  - the MTP head drafting one token (its pair written and its logits read, as the drafter does
    every step): th;
  - the distinct routed experts each batch size touched per MoE layer (the engine's counters).
Speed-up of decode with one draft at acceptance a: (1 + a) / ((t2 + th) / t1); printed for the
acceptance DeepSeek reports for V3 (0.85) and for any given with --acceptance. Also the memory the
drafter adds: its context (RSS while a second drafter is made) and the MTP layer's weights.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--acceptance", type=float, action="append", default=[])
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    from llama_cpp import llama_cpp as C
    from deepseek_cpu import Llama
    from deepseek_cpu.gguf_header import read
    from deepseek_cpu.runtime.engine import cpu_model
    from deepseek_cpu.runtime.mtp_draft import MtpDraft

    kw = {"n_threads": a.threads, "n_threads_batch": a.threads} if a.threads else {}
    llm = Llama(a.model, mtp=1, n_ctx=a.depth + 64, n_batch=512, n_ubatch=512, verbose=False, **kw)
    if llm.mtp_stats is None:
        sys.exit("the model has no MTP layer that drafts")
    ctx, mem = llm._ctx.ctx, C.llama_get_memory(llm._ctx.ctx)
    rng = np.random.default_rng(0)
    n_vocab = llm.n_vocab()
    lo, hi = min(1000, n_vocab // 4), min(n_vocab, 100000)  # plain tokens (a tiny test vocabulary has fewer)
    prompt = rng.integers(lo, hi, a.depth).tolist()
    llm.eval(prompt)  # through the drafter: its cache holds the prompt's pairs, as in generation

    batch = C.llama_batch_init(8, 0, 1)

    def decode(tokens, pos0):
        batch.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, pos0 + i, 1, True
            batch.seq_id[i][0] = 0
        if C.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        C.llama_synchronize(ctx)

    draft = llm._mtp
    h = read(a.model)
    n_main = int(h.get(f"{h.arch}.block_count")) - int(h.get(f"{h.arch}.nextn_predict_layers") or 0)

    def head_step():
        ids = np.asarray(list(llm.input_ids[:a.depth]) + [int(rng.integers(lo, hi))], dtype=np.intc)
        draft.expect = draft.last_draft = None
        out = draft(ids)
        C.llama_memory_seq_rm(draft.mem, 0, a.depth, -1)  # the head's cache back to the prompt
        draft.mtp_end = a.depth
        return out

    times: dict[str, list[float]] = {"t1": [], "t2": [], "t3": [], "th": []}
    experts: dict[int, list[float]] = {1: [], 2: [], 3: []}
    kinds = ["t1", "t2", "t3", "th"]
    for r in range(a.repeat + 1):  # the first round warms up, not counted
        for kind in (kinds if r % 2 == 0 else kinds[::-1]):
            if kind == "th":
                t = time.perf_counter()
                head_step()
                dt = time.perf_counter() - t
            else:
                k = int(kind[1])
                toks = rng.integers(lo, hi, k).tolist()
                llm.reset_expert_usage()
                t = time.perf_counter()
                decode(toks, a.depth)
                dt = time.perf_counter() - t
                if r:  # the main model's MoE layers (the MTP layer does not run in a verify)
                    u = llm.expert_usage()
                    main_rows = np.asarray(u.layers) < n_main
                    experts[k].append(float((u.counts[main_rows] > 0).sum(axis=1).mean()))
                C.llama_memory_seq_rm(mem, 0, a.depth, -1)
            if r:
                times[kind].append(dt * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    c2, c3, ch = med["t2"] / med["t1"], med["t3"] / med["t1"], med["th"] / med["t1"]

    # memory: a second drafter (its context: one-layer KV cache, compute buffer), and the MTP weights
    before = rss()
    extra = MtpDraft(llm, 1)
    added_ctx = rss() - before
    extra.close()
    mtp_weights = sum(t.nbytes for t in h.tensors if t.name.startswith(f"blk.{n_main}."))

    acc = sorted({0.85, *a.acceptance})
    res = {
        "model": os.path.abspath(a.model), "cpu": cpu_model(), "threads": llm.context_params.n_threads,
        "depth": a.depth, "repeat": a.repeat, "ms_median": med, "ms_all": times,
        "verify2_over_step": c2, "verify3_over_step": c3, "head_over_step": ch,
        "experts_per_moe_layer": {k: statistics.mean(v) for k, v in experts.items() if v},
        "speedup_one_draft": {str(x): (1 + x) / (c2 + ch) for x in acc},
        "drafter_context_bytes": added_ctx, "mtp_layer_weight_bytes": mtp_weights,
    }
    print(f"{res['cpu']}, {res['threads']} threads, depth {a.depth}, medians of {a.repeat}:")
    print(f"  decode 1 token {med['t1']:.1f} ms; verify 2 tokens {med['t2']:.1f} ms ({c2:.2f}x), "
          f"3 tokens {med['t3']:.1f} ms ({c3:.2f}x); MTP head draft {med['th']:.1f} ms ({ch:.2f}x)")
    print("  routed experts touched per MoE layer: " +
          ", ".join(f"{k} token{'s' if k > 1 else ''} {v:.1f}" for k, v in res["experts_per_moe_layer"].items()))
    for x, s in res["speedup_one_draft"].items():
        print(f"  one draft, acceptance {x}: (1 + a) / ({c2:.2f} + {ch:.2f}) = {s:.2f}x decode")
    print(f"  the drafter adds: context {added_ctx / 2**20:.1f} MiB; MTP layer weights "
          f"{mtp_weights / 2**30:.2f} GiB (loaded only with mtp)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    C.llama_batch_free(batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
