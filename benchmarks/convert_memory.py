"""Peak memory of `deepseek-cpu convert` on a multi-GB synthetic DeepSeek checkpoint.

    python benchmarks/convert_memory.py --layers 3 6 --outtype bf16   # with the package installed

For each layer count, writes a random checkpoint in the layout DeepSeek publishes
(config.json in the original form, bf16 per-expert tensors in ~1 GB safetensors shards
+ model.safetensors.index.json, the tokenizer of tests/fixtures/v2_lite) with
DeepSeek-V2-Lite's widths (hidden 2048, 64 routed experts of 1408, 2 shared, no q-LoRA,
vocab 102400) but fewer layers, converts it in a child process and reports, as JSON:

  checkpoint_bytes         size of the safetensors shards
  largest_stacked_f32      bytes of the largest stacked expert tensor as float32 (the
                           converter stacks experts in f32: 64 x 1408 x 2048 x 4 = 738 MB)
  largest_tensor_f32       the largest output tensor as float32; with V2-Lite's widths
                           that is the embedding / output matrix (102400 x 2048 x 4 = 839 MB)
  peak_rss                 the child's peak resident set (ru_maxrss from wait4)
  peak_rss_anon/file       peaks of RssAnon / RssFile polled from /proc (file = mapped
                           checkpoint pages that are resident in the process)
  baseline_rss             peak RSS converting the tiny tests/fixtures/v2_lite (interpreter,
                           numpy, gguf: the constant)
  overhead                 peak_rss - baseline_rss - largest_tensor_f32
  seconds, output_bytes

The goal: peak_rss ~ largest_stacked_f32 + a constant, the same at every layer count.
The checkpoint and output are written under --workdir (default: a temporary directory
in /tmp) and deleted afterwards unless --keep.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from deepseek_cpu.converters.deepseek import checkpoint_tensors, tensor_table

REPO = Path(__file__).resolve().parent.parent
TOKENIZER_FROM = REPO / "tests" / "fixtures" / "v2_lite"
SHARD_BYTES = 1 << 30

V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "attention_bias": False, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
    "bos_token_id": 398, "eos_token_id": 399,
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 10944, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "moe_intermediate_size": 1408, "moe_layer_freq": 1,
    "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": False,
    "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
    "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy",
    "torch_dtype": "bfloat16", "transformers_version": "4.39.3", "use_cache": True,
    "v_head_dim": 128, "vocab_size": 102400,
}


class RandomBF16:
    """bf16 bytes with std ~0.02, cut from one random block at varying offsets (fast)."""

    def __init__(self, n: int = 1 << 25, seed: int = 0):
        rng = np.random.default_rng(seed)
        f = (rng.standard_normal(n, dtype=np.float32) * 0.02).view(np.uint32)
        self.block = (f >> 16).astype(np.uint16)
        self.pos = 0

    def chunks(self, count: int):
        while count:
            take = min(count, len(self.block) - self.pos)
            yield self.block[self.pos:self.pos + take]
            count -= take
            self.pos = (self.pos + take * 7 + 1) % len(self.block)


def write_checkpoint(model_dir: Path, config: dict) -> int:
    """Write config, tokenizer, bf16 shards + index; returns the shards' total size."""
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_FROM / f, model_dir / f)
    shapes = checkpoint_tensors(config)  # the converter's own table, in state_dict order
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        n = int(np.prod(shape)) * 2
        if size and size + n > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    rnd = RandomBF16()
    weight_map, total = {}, 0
    for k, names in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name in names:
            n = int(np.prod(shapes[name])) * 2
            header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [off, off + n]}
            off += n
            weight_map[name] = fname
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        with open(model_dir / fname, "wb") as f:
            f.write(len(hb).to_bytes(8, "little"))
            f.write(hb)
            for name in names:
                for chunk in rnd.chunks(int(np.prod(shapes[name]))):
                    f.write(chunk.tobytes())
        total += off
    (model_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return total


def _poll(pid: int, peaks: dict, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    key = line.split(":")[0]
                    if key in ("RssAnon", "RssFile", "VmRSS"):
                        peaks[key] = max(peaks.get(key, 0), int(line.split()[1]) * 1024)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass
        stop.wait(0.05)


def measure_convert(model_dir: Path, out: Path, outtype: str) -> dict:
    """Run `python -m deepseek_cpu convert` in a child; its peak RSS and time."""
    cmd = [sys.executable, "-m", "deepseek_cpu", "convert", str(model_dir), str(out), "--outtype", outtype, "--quiet"]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peaks: dict[str, int] = {}
    stop = threading.Event()
    th = threading.Thread(target=_poll, args=(proc.pid, peaks, stop), daemon=True)
    th.start()
    _, status, ru = os.wait4(proc.pid, 0)
    dt = time.time() - t0
    stop.set()
    th.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    stdout, stderr = proc.stdout.read().decode(), proc.stderr.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"conversion failed ({proc.returncode}):\n{stderr}")
    return {"peak_rss": ru.ru_maxrss * 1024, "peak_rss_anon": peaks.get("RssAnon"),
            "peak_rss_file": peaks.get("RssFile"), "seconds": round(dt, 1),
            "output_bytes": out.stat().st_size, "stdout": stdout.strip()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[3, 6],
                    help="layer counts to measure (1 dense + MoE layers); default 3 6")
    ap.add_argument("--outtype", default="bf16", choices=["f32", "f16", "bf16", "q8_0"])
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints and outputs")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="convert-memory-", dir=args.workdir))
    results = []
    try:
        base = measure_convert(TOKENIZER_FROM, work / "tiny.gguf", args.outtype)
        # from the converter's tensor table (the same for every layer count > 1)
        table = tensor_table(dict(V2_LITE, num_hidden_layers=2))
        largest = max(int(np.prod(s.shape)) for s in table if s.op == "stack") * 4
        # V2-Lite's embedding / output matrix is bigger still as f32 (102400 x 2048 x 4 = 839 MB)
        largest_any = max(int(np.prod(s.shape)) for s in table) * 4
        for n in args.layers:
            cfg = dict(V2_LITE, num_hidden_layers=n)
            model = work / f"synthetic-v2-lite-{n}L"
            t0 = time.time()
            size = write_checkpoint(model, cfg)
            wrote = time.time() - t0
            r = measure_convert(model, work / f"{n}L.gguf", args.outtype)
            row = {"layers": n, "outtype": args.outtype, "checkpoint_bytes": size,
                   "shards": len(list(model.glob("*.safetensors"))), "largest_stacked_f32": largest,
                   "largest_tensor_f32": largest_any, "baseline_rss": base["peak_rss"], **r,
                   "overhead": r["peak_rss"] - base["peak_rss"] - largest_any,
                   "write_checkpoint_seconds": round(wrote, 1)}
            row.pop("stdout")
            results.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            if not args.keep:
                shutil.rmtree(model)
                (work / f"{n}L.gguf").unlink()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    gib = 2 ** 30
    print(json.dumps({"results": results, "summary": [
        {"layers": r["layers"], "checkpoint_GiB": round(r["checkpoint_bytes"] / gib, 2),
         "largest_stacked_f32_GiB": round(r["largest_stacked_f32"] / gib, 3),
         "largest_tensor_f32_GiB": round(r["largest_tensor_f32"] / gib, 3),
         "peak_rss_GiB": round(r["peak_rss"] / gib, 3), "baseline_GiB": round(r["baseline_rss"] / gib, 3),
         "overhead_GiB": round(r["overhead"] / gib, 3), "seconds": r["seconds"]} for r in results]}, indent=2))


if __name__ == "__main__":
    main()
