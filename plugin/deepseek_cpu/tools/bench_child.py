"""One run of `deepseek-cpu bench` (tools/bench.py): one engine in this process, the child
that the parent starts as `python -m deepseek_cpu.tools.bench_child SPEC.json`; it writes its
numbers (or its error) to the result file the spec names.

One run (child process), with the llama_cpp low-level API on a context made by the
engine's `Llama` class (ours: deepseek_cpu.Llama, stock: llama_cpp.Llama), so each engine
keeps its own defaults; both get the same n_ctx, n_batch = n_ubatch = pp and threads:
  1. load: Llama(...) construction (model load, repacking, context)           -> load_s
  2. warm-up: one pp-token prefill, not timed into pp (first touches of the
     weights, thread start-up), then the cache is cleared                        -> first_prefill_s
  3. prefill: pp prompt tokens in one batch                                      -> pp_tok_s
     time to first token = that prefill + choosing the first token               -> ttft_s
  4. decode: tg tokens one at a time after the prompt (greedy)                   -> tg_tok_s
  5. with --ctx-depth D > 0: clear, fill D tokens in pp-token batches            -> fill_tok_s
     then decode tg tokens at depth D                                            -> tg_depth_tok_s
  6. peak RSS (VmHWM) of the process                                             -> peak_rss_bytes
With a text (bench --mtp), first: tg tokens generated greedily after that text by Llama.generate
(speculative with MTP drafts for the "ours+mtp" engine, which measures only that)  -> tg_text_tok_s
The prompt is random token ids (fixed seed), the same for every engine.
"""
from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

from ..runtime.engine import amx_status, build_info, loaded_library_path


def _proc_status(key: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _io_counters() -> tuple[int, int]:
    """(major page faults, bytes read from block devices) of this process so far."""
    import resource
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    read = 0
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                read = int(line.split()[1])
    except OSError:
        pass
    return faults, read


def child_run(spec: dict) -> dict:
    """Runs in the child process; `spec` from the parent. Returns the run's numbers."""
    import numpy as np
    engine = spec["engine"]
    if engine.startswith("ours"):
        from deepseek_cpu.runtime.llama import Llama
    else:
        from llama_cpp import Llama
    import llama_cpp as lc

    pp, tg, depth = spec["pp"], spec["tg"], spec["ctx_depth"]
    kw = dict(n_ctx=spec["n_ctx"], n_batch=pp, n_ubatch=pp, n_threads=spec["threads"],
              n_threads_batch=spec["threads"], verbose=bool(spec.get("verbose")))
    kw.update(spec.get("opts") or {})
    # use_extra_bufts=False: llama.cpp's repacking off, for either engine: every weight used from
    # the file mapping (stock as a user with little memory runs it)
    from ..runtime.model_params import no_repacking
    placement = no_repacking() if kw.pop("use_extra_bufts", True) is False else contextlib.nullcontext()
    io0 = _io_counters()
    t0 = time.perf_counter()
    with placement:
        llm = Llama(spec["model"], **kw)
    load_s = time.perf_counter() - t0
    rss_load = _proc_status("VmRSS")
    if spec.get("load_only"):
        return {"load_s": load_s, "rss_after_load_bytes": rss_load, "peak_rss_bytes": _proc_status("VmHWM")}
    ctx = llm._ctx.ctx
    n_vocab = llm.n_vocab()
    mem = lc.llama_get_memory(ctx)

    rng = np.random.default_rng(spec.get("seed", 0))
    hi = min(n_vocab, 100000)  # plain BPE tokens of both vocabularies, no specials
    lo = min(1000, hi // 4)    # (a tiny test vocabulary has fewer than 1000)
    prompt = rng.integers(lo, hi, size=max(pp, depth)).tolist()
    batch = lc.llama_batch_init(max(pp, 1), 0, 1)

    def decode(tokens, pos0):
        n = len(tokens)
        batch.n_tokens = n
        for i, t in enumerate(tokens):
            batch.token[i] = t
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == n - 1
        rc = lc.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        lc.llama_synchronize(ctx)

    def argmax():
        p = lc.llama_get_logits_ith(ctx, -1)
        return int(np.ctypeslib.as_array(p, shape=(n_vocab,)).argmax())

    # Greedy decoding of random weights soon repeats one token, and then one set of experts:
    # "random_decode" feeds random tokens instead (the argmax is still computed), so that decode
    # routes as varied text would; it matters where routing decides what is read from disk.
    random_decode = bool(spec.get("random_decode"))

    def generate(pos0, n):
        times = []
        tok = argmax()
        for i in range(n):
            t = time.perf_counter()
            decode([tok], pos0 + i)
            tok = argmax()
            times.append(time.perf_counter() - t)
            if random_decode:
                tok = int(rng.integers(lo, hi))
        return times

    out: dict = {"load_s": load_s, "rss_after_load_bytes": rss_load}
    if spec.get("text_only"):
        out.update(_text_decode(llm, spec["text"], pp, tg))
        out["peak_rss_bytes"] = _proc_status("VmHWM")
        return {**out, **_what_ran(llm, engine)}
    # warm-up
    t = time.perf_counter()
    decode(prompt[:pp], 0)
    out["first_prefill_s"] = time.perf_counter() - t
    lc.llama_memory_clear(mem, True)
    # prefill + time to first token
    t = time.perf_counter()
    decode(prompt[:pp], 0)
    dt = time.perf_counter() - t
    first = argmax()
    out["ttft_s"] = time.perf_counter() - t
    out["pp_tok_s"] = pp / dt
    # decode after the prompt
    io1 = _io_counters()
    times = generate(pp, tg)
    io2 = _io_counters()
    out["tg_tok_s"] = tg / sum(times)
    # what the disk gave: through load + prompt, and per decoded token (cold-cache runs)
    out["load_prefill_major_faults"], out["load_prefill_read_bytes"] = io1[0] - io0[0], io1[1] - io0[1]
    out["tg_major_faults_per_token"] = (io2[0] - io1[0]) / max(tg, 1)
    out["tg_read_bytes_per_token"] = (io2[1] - io1[1]) / max(tg, 1)
    out["tg_token_ms_median"] = statistics.median(times) * 1e3
    if depth > 0:
        lc.llama_memory_clear(mem, True)
        t = time.perf_counter()
        for s in range(0, depth, pp):
            decode(prompt[s:min(s + pp, depth)], s)
        out["fill_tok_s"] = depth / (time.perf_counter() - t)
        times = generate(depth, tg)
        out["tg_depth_tok_s"] = tg / sum(times)
    lc.llama_batch_free(batch)
    if spec.get("text"):  # real text, greedy (MTP drafts mean nothing on random token ids)
        lc.llama_memory_clear(mem, True)
        out.update(_text_decode(llm, spec["text"], pp, tg))
    out["peak_rss_bytes"] = _proc_status("VmHWM")
    out["first_token"] = first
    if engine.startswith("ours"):  # the routing the run saw (random prompt; synth's planted skew, if any)
        try:
            usage = llm.expert_usage()
            out["experts_top10pct_share"] = float(usage.coverage(0.1).mean())
            out["experts_unused"] = int(usage.unused().sum())
        except Exception:  # a dense model, or an engine without the counters
            pass
        if getattr(llm, "memory_plan", None) is not None:  # under a budget: how well pre-gating predicted
            from ..runtime.experts import expert_prefetch_stats
            st = expert_prefetch_stats()
            out["pregate_hit_rate"] = st["chosen_predicted"] / st["chosen"] if st["chosen"] else None
    return {**out, **_what_ran(llm, engine)}


def _what_ran(llm, engine: str) -> dict:
    import llama_cpp as lc
    import llama_cpp.llama_cpp as lcl
    lib = lcl._lib
    out = {"build_info": build_info(lib), "library": loaded_library_path(lib)}
    if engine.startswith("ours"):
        out["amx"] = amx_status()
    out["flash_attn_type"] = int(llm.context_params.flash_attn_type)
    out["n_ctx"] = llm.n_ctx()
    out["system_info"] = lc.llama_print_system_info().decode(errors="replace")
    return out


def _text_decode(llm, text: str, pp: int, tg: int) -> dict:
    """Greedy generation of tg tokens after (at most pp tokens of) `text` through Llama.generate,
    the path create_completion takes, where MTP drafts are verified: decode tok/s after the first
    token, the tokens themselves (with and without MTP they must be the same) and MTP's counters."""
    prompt = llm.tokenize(text.encode(), add_bos=True)[:pp]
    llm.reset()
    toks, t_first = [], None
    for tok in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        if t_first is None:
            t_first = time.perf_counter()
        toks.append(int(tok))
        if len(toks) >= tg:
            break
    dt = time.perf_counter() - t_first
    out = {"tg_text_tok_s": (len(toks) - 1) / dt if dt > 0 and len(toks) > 1 else None, "text_tokens": toks,
           "text_prompt_tokens": len(prompt)}
    stats = getattr(llm, "mtp_stats", None)
    if stats is not None:
        out.update(mtp_acceptance=stats.acceptance, mtp_tokens_per_step=stats.tokens_per_step, mtp=stats.as_dict())
    return out


def _child_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    try:
        res = {"ok": True, **child_run(spec)}
    except Exception as e:  # reported to the parent, which decides
        import traceback
        res = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    Path(spec["result"]).write_text(json.dumps(res))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 2:
        sys.exit(_child_main(sys.argv[1]))
    print("internal entry point of `deepseek-cpu bench`", file=sys.stderr)
    sys.exit(2)
