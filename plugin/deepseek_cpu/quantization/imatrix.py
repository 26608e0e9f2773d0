"""Importance matrices: made by llama.cpp's own `llama-imatrix` (built from our patched tree
and shipped beside llama-server), read here for the quantizer.

The file is llama-imatrix's GGUF: for every weight it saw, `<tensor>.in_sum2` (the sum of
squared activations per input column, one row per expert for a stacked expert tensor) and
`<tensor>.counts` (how many activation rows each expert saw), plus `imatrix.datasets`,
`imatrix.chunk_count`, `imatrix.chunk_size`. The importance the quantizer takes is
in_sum2 / count per expert, the normalisation llama-quantize applies (tools/quantize). An
expert the calibration text never routed to (count 0) gets uniform importance (all ones), as
llama-quantize does; `read_imatrix` says which and how many.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import DeepseekCpuError

SUMS, COUNTS = ".in_sum2", ".counts"


class ImatrixError(DeepseekCpuError, ValueError):
    """An importance matrix that cannot be used (unreadable, or made on another model)."""


@dataclass
class Imatrix:
    """Per-tensor importance (name -> float32 [n_expert * ne0]), ready for the quantizer."""
    path: Path
    values: dict[str, np.ndarray]
    counts: dict[str, np.ndarray]               # name -> activation rows seen, per expert
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0

    def unseen_experts(self) -> dict[str, int]:
        """Stacked expert tensors with experts that saw no token: name -> how many."""
        return {n: int((c == 0).sum()) for n, c in self.counts.items() if c.size > 1 and (c == 0).any()}

    def channel_peaks(self) -> dict[str, float]:
        """Per tensor: its input's largest channel energy over the median channel's (stacked
        experts: the median over the experts that saw tokens). Real LLMs' inputs have channels
        hundreds of times the median; an importance matrix pays off where this is large."""
        peaks = {}
        for name, v in self.values.items():
            c = self.counts[name]
            rows = v.reshape(len(c), -1)[c > 0]
            if len(rows):
                med = np.maximum(np.median(rows, axis=1), np.finfo(np.float32).tiny)
                peaks[name] = float(np.median(rows.max(axis=1) / med))
        return peaks

    def summary(self) -> str:
        unseen = self.unseen_experts()
        n_exp = sum(c.size for n, c in self.counts.items() if c.size > 1)
        lines = [f"{len(self.values)} tensors, {self.chunk_count} chunks of {self.chunk_size} tokens"
                 + (f" from {', '.join(self.datasets)}" if self.datasets else "")]
        peaks = self.channel_peaks()
        if peaks:
            top = max(peaks, key=peaks.get)
            lines.append(f"input channels: the largest carries {np.median(list(peaks.values())):.0f}x the median "
                         f"channel's energy (median over tensors; {peaks[top]:.0f}x in {top})")
        if unseen:
            lines.append(f"warning: {sum(unseen.values())} of {n_exp} expert slots in {len(unseen)} tensors saw "
                         "no calibration token and get uniform importance (more or more varied text fixes it): "
                         + ", ".join(f"{n} ({k})" for n, k in list(unseen.items())[:4])
                         + (" ..." if len(unseen) > 4 else ""))
        return "\n".join(lines)


def read_imatrix(path: str | os.PathLike, model_tensors: dict[str, tuple[int, ...]] | None = None) -> Imatrix:
    """Read llama-imatrix's GGUF. With `model_tensors` (GGUF name -> ggml shape ne, of the model
    to quantize) every entry must name a tensor of that model with the matching size, else
    ImatrixError names the first mismatch."""
    import gguf
    path = Path(path)
    if not path.is_file():
        raise ImatrixError(f"{path}: no such importance-matrix file")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # not a GGUF (e.g. the legacy .dat format) or damaged
        raise ImatrixError(f"{path}: not an importance matrix in llama-imatrix's GGUF format ({e}); "
                           "make one with `deepseek-cpu imatrix`") from None
    sums, counts = {}, {}
    for t in reader.tensors:
        if t.name.endswith(SUMS):
            sums[t.name[: -len(SUMS)]] = np.asarray(t.data, dtype=np.float32)
        elif t.name.endswith(COUNTS):
            counts[t.name[: -len(COUNTS)]] = np.asarray(t.data, dtype=np.float32).reshape(-1)
    if not sums:
        raise ImatrixError(f"{path}: holds no importance data (no *{SUMS} tensors)")
    values, seen = {}, {}
    for name in sorted(sums):
        if name not in counts:
            raise ImatrixError(f"{path}: {name} has sums but no counts")
        s, c = sums[name].reshape(len(counts[name]), -1), counts[name]
        if model_tensors is not None:
            _check_against_model(path, name, s.shape, model_tensors)
        v = np.ones_like(s)
        used = c > 0
        v[used] = s[used] / c[used, None]
        if not np.isfinite(v).all():
            raise ImatrixError(f"{path}: {name} has non-finite importance values")
        values[name], seen[name] = np.ascontiguousarray(v.reshape(-1), dtype=np.float32), c
    fields = reader.fields

    def scalar(key, default=0):
        f = fields.get(key)
        return int(f.parts[f.data[0]][0]) if f is not None else default

    datasets = []
    f = fields.get("imatrix.datasets")
    if f is not None:
        datasets = [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]
    return Imatrix(path, values, seen, datasets, scalar("imatrix.chunk_count"), scalar("imatrix.chunk_size"))


def _check_against_model(path: Path, name: str, shape: tuple[int, int], model: dict[str, tuple[int, ...]]) -> None:
    """llama-quantize's contract: ne0 x n_mat values (n_mat = ne2: one row per expert, or per
    head of a batched product such as attn_k_b), with one count per expert or a single one."""
    n_counts, row = shape
    if name not in model:
        if " (" in name:  # e.g. "blk.0.attn_v_b.weight (reshaped)": a view our prefill path makes
            raise ImatrixError(f"{path}: {name} is not a model tensor; this file was made by llama-imatrix on "
                               "our engine's prefill attention path; make it with `deepseek-cpu imatrix`")
        raise ImatrixError(f"{path} does not fit this model: it has importance data for {name}, "
                           "which the model does not have (made on another model?)")
    ne = model[name]
    n_mat = ne[2] if len(ne) > 2 else 1
    if n_counts * row != ne[0] * n_mat or n_counts not in (1, n_mat):
        raise ImatrixError(f"{path} does not fit this model: {name} has {n_counts} x {row} importance values, "
                           f"the model's tensor needs {n_mat} x {ne[0]} (made on another model?)")


def model_tensor_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> ggml shape (ne0, ne1, ...) of a model file."""
    import gguf
    reader = gguf.GGUFReader(path)
    return {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}


def imatrix_program() -> Path:
    """llama-imatrix shipped next to our libllama (or $DEEPSEEK_CPU_LLAMA_IMATRIX)."""
    env = os.environ.get("DEEPSEEK_CPU_LLAMA_IMATRIX")
    if env:
        return Path(env)
    from .. import _dropin
    found = _dropin.find_lib_dir(name="llama-imatrix")
    if found is None:
        raise ImatrixError("llama-imatrix is not installed with this build of deepseek-cpu "
                           "(built with -DDEEPSEEK_CPU_BUILD_SERVER=OFF?)")
    return Path(found) / "llama-imatrix"


def make_imatrix(model: str | os.PathLike, text: str | os.PathLike, out: str | os.PathLike, *,
                 ctx: int = 512, chunks: int | None = None, threads: int | None = None,
                 progress: bool = True) -> Imatrix:
    """Run llama-imatrix over `text` with `model` and write `out` (atomically). Returns the
    matrix as read back, validated against the model."""
    from ..runtime.resources import default_threads
    model, text, out = Path(model), Path(text), Path(out)
    for p, what in ((model, "model"), (text, "calibration text")):
        if not p.is_file():
            raise ImatrixError(f"{p}: no such {what} file")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial.gguf")
    cmd = [str(imatrix_program()), "-m", str(model), "-f", str(text), "-o", str(tmp),
           "-c", str(ctx), "-b", str(ctx), "-ub", str(ctx), "-t", str(threads or default_threads()),
           "--no-ppl", "--process-output", "--output-frequency", "1000000", "--save-frequency", "0"]
    if chunks:
        cmd += ["--chunks", str(chunks)]
    # attention through stock llama.cpp's MLA products (q absorbed by attn_k_b, attn_v_b per head):
    # our prefill path decompresses the latent cache with reshaped copies of those weights,
    # whose statistics would not be per head as the quantizer (and stock's imatrix files) want
    env = {**os.environ, "DEEPSEEK_CPU_MLA_MHA": "0"}
    lines: list[str] = []
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", env=env)
        bar = _ChunkBar(progress)
        for line in proc.stdout:
            lines.append(line)
            bar.feed(line)
        rc = proc.wait()
        bar.close()
        if rc != 0 or not tmp.is_file():
            tail = "".join(lines[-12:]).strip()
            raise ImatrixError(f"llama-imatrix failed (exit {rc}):\n{tail}")
        result = read_imatrix(tmp, model_tensor_shapes(model))
        os.replace(tmp, out)
        result.path = out
        return result
    finally:
        tmp.unlink(missing_ok=True)


class _ChunkBar:
    """A progress bar fed by llama-imatrix's "compute_imatrix: ... N chunks" and "[i]" lines."""

    def __init__(self, enabled: bool):
        import re
        from tqdm import tqdm
        self._total = re.compile(r"computing over (\d+) chunks")
        self._step = re.compile(r"^\[(\d+)\]")
        self.bar = tqdm(total=None, unit="chunk", desc="imatrix", leave=False, file=sys.stderr,
                        disable=not enabled)

    def feed(self, line: str) -> None:
        m = self._total.search(line)
        if m:
            self.bar.total = int(m[1])
            self.bar.refresh()
        for m in self._step.finditer(line.strip()):
            self.bar.update(int(m[1]) - self.bar.n)

    def close(self) -> None:
        self.bar.close()
