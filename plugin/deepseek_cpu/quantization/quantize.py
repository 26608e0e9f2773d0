"""`quantize`: a GGUF -> a GGUF quantized by a scheme, with llama.cpp's own quantizer
(`llama_model_quantize` of our libllama, in process): the scheme's base file type, its rules
and the caller's `--tensor-type` overrides as tensor-type overrides, an importance matrix as
llama_model_imatrix_data. Written to a temporary name and renamed: an error, a full disk or an
interrupt leaves nothing behind.
"""
from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import os
import re
import shutil
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..errors import DeepseekCpuError
from . import registry
from .schemes import UNQUANTIZED, Scheme, ggml_type, type_name


class QuantizeError(DeepseekCpuError, RuntimeError):
    """A quantization that cannot be done (bad input, refused requantization, llama.cpp failed)."""


class LlamaQuantizeFailed(QuantizeError):
    """llama.cpp's quantizer itself failed; the message ends with its own words."""


@dataclass
class QuantizeResult:
    path: Path
    scheme: str
    bits_per_weight: float          # of the quantized weight matrices as written
    size: int                       # bytes of the file
    types: dict[str, int]           # GGML type -> number of tensors
    seconds: float
    # tensors whose rows are not whole blocks of the scheme's type, as llama.cpp reported them, one line
    # per kind: "blk.*.ffn_down_exps.weight (rows of 1408): q3_K -> q4_0, 26 tensors"
    fallbacks: tuple[str, ...] = ()


def parse_tensor_types(specs) -> tuple[tuple[str, str], ...]:
    """`PATTERN=TYPE` strings (llama-quantize --tensor-type) -> ((pattern, type), ...)."""
    out = []
    for spec in specs or ():
        pattern, sep, tname = spec.rpartition("=")
        if not sep or not pattern:
            raise QuantizeError(f"--tensor-type {spec!r}: expected PATTERN=TYPE, e.g. ffn_down_exps=q6_K")
        try:
            re.compile(pattern)
            t = ggml_type(tname)
        except (re.error, ValueError) as e:
            raise QuantizeError(f"--tensor-type {spec!r}: {e}") from None
        out.append((pattern, type_name(t)))
    return tuple(out)


def _already_quantized(src: Path) -> list[tuple[str, str]]:
    import gguf
    reader = gguf.GGUFReader(src)
    # I32 tensors are tables (V4's hash routing), not quantized weights; llama.cpp copies them
    return [(t.name, t.tensor_type.name) for t in reader.tensors
            if t.tensor_type not in UNQUANTIZED and t.tensor_type != gguf.GGMLQuantizationType.I32
            and len(t.shape) > 1]


def _copied_exactly(sch: Scheme, name: str, type_name: str) -> bool:
    """A tensor already in the type the scheme gives it is copied by llama.cpp, not re-quantized:
    V4's MXFP4 routed experts under mxfp4_moe (or a rule naming mxfp4)."""
    import re
    from .schemes import ROUTED_EXPERTS
    if type_name != "MXFP4":
        return False
    rule = sch.rule_for(name)
    if rule is not None:
        return rule.lower() == "mxfp4"
    return sch.base == "mxfp4_moe" and re.search(ROUTED_EXPERTS, name) is not None


def quantize(src: str | os.PathLike, out: str | os.PathLike, scheme: str | Scheme = "q4_k_m", *,
             imatrix: str | os.PathLike | None = None, tensor_types=(), allow_requantize: bool = False,
             nthread: int | None = None, progress: bool = True, verbose: bool = False) -> QuantizeResult:
    """Quantize GGUF `src` into `out` by `scheme` (a registered name or a Scheme).

    `tensor_types`: extra (pattern, type) overrides or PATTERN=TYPE strings, ahead of the
    scheme's own rules. `imatrix`: llama-imatrix's GGUF for this model (checked against it)."""
    from .imatrix import model_tensor_shapes, read_imatrix
    t0 = time.time()
    src, out = Path(src), Path(out)
    sch = scheme if isinstance(scheme, Scheme) else registry.get(scheme)
    overrides = tuple(tensor_types) if all(isinstance(x, tuple) for x in tensor_types or ()) \
        else parse_tensor_types(tensor_types)
    if not src.is_file():
        raise QuantizeError(f"{src}: no such file")
    if out.resolve() == src.resolve():
        raise QuantizeError(f"{out}: the output would overwrite the input")
    try:
        quantized = _already_quantized(src)
    except Exception as e:
        raise QuantizeError(f"{src}: not a readable GGUF ({e})") from None
    quantized = [(n, t) for n, t in quantized if not _copied_exactly(sch, n, t)]
    if quantized and not allow_requantize:
        kinds = Counter(t for _, t in quantized)
        raise QuantizeError(f"{src} is already quantized ({', '.join(f'{n} {k}' for k, n in kinds.items())} "
                            f"tensors, e.g. {quantized[0][0]}); quantizing it again loses quality. Start from "
                            "the bf16/f16/f32 GGUF, or pass --allow-requantize to do it anyway")
    imx = read_imatrix(imatrix, model_tensor_shapes(src)) if imatrix is not None else None
    _check_disk(src, out, sch)

    from ..runtime import llama_log  # noqa: F401  (log callback that follows sys.stderr)
    import llama_cpp
    from tqdm import tqdm

    from ..runtime.resources import default_threads
    params = llama_cpp.llama_model_quantize_default_params()
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_{sch.file_type.name}", None)
    if ftype is None:
        raise QuantizeError(f"this llama.cpp has no file type {sch.file_type.name}")
    params.ftype = ftype
    params.nthread = nthread or default_threads()
    params.allow_requantize = allow_requantize
    keep = []  # ctypes buffers that must outlive the call
    rules = (*overrides, *sch.rules)
    if rules:
        arr = (llama_cpp.llama_model_tensor_override * (len(rules) + 1))()
        for i, (pattern, tname) in enumerate(rules):
            b = pattern.encode()
            keep.append(b)
            arr[i].pattern = b
            arr[i].type = int(ggml_type(tname))
        arr[len(rules)].pattern = None
        keep.append(arr)
        params.tt_overrides = ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_tensor_override))
    if imx is not None:
        arr = (llama_cpp.llama_model_imatrix_data * (len(imx.values) + 1))()
        for i, (name, v) in enumerate(imx.values.items()):
            b = name.encode()
            keep += [b, v]
            arr[i].name = b
            arr[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            arr[i].size = v.size
        arr[len(imx.values)].name = None
        keep.append(arr)
        params.imatrix = ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))

    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    llog = logging.getLogger("llama-cpp-python")
    level = llog.level
    llog.setLevel(logging.DEBUG)
    bar = tqdm(total=None, unit="tensor", desc=f"{out.name} ({sch.name})", leave=False, file=sys.stderr,
               disable=verbose or not progress)
    sink = _QuantLog(bar)
    rc: list[int] = []
    try:
        with (contextlib.nullcontext() if verbose else contextlib.redirect_stderr(sink)):
            # in a thread, so that Ctrl-C reaches us at once (the C call cannot be interrupted):
            # the partial file is removed and the interrupt re-raised; the thread, a daemon,
            # writes on into the unlinked file until the process exits
            worker = threading.Thread(target=lambda: rc.append(llama_cpp.llama_model_quantize(
                str(src).encode(), str(tmp).encode(), ctypes.byref(params))), daemon=True)
            worker.start()
            while worker.is_alive():
                worker.join(0.2)
        if not rc or rc[0] != 0 or not tmp.is_file():
            lines = [ln.strip() for ln in sink.text().splitlines() if ln.strip()]
            detail = next((ln for ln in reversed(lines) if "failed" in ln or "error" in ln.lower()),
                          lines[-1] if lines else "no message")
            raise LlamaQuantizeFailed(f"llama.cpp could not quantize {src.name} with {sch.name} "
                                f"(code {rc[0] if rc else '?'}): {detail}")
        os.replace(tmp, out)
    finally:
        bar.close()
        llog.setLevel(level)
        tmp.unlink(missing_ok=True)
    bpw, types = written_types(out)
    return QuantizeResult(out, sch.name, bpw, out.stat().st_size, types, time.time() - t0,
                          fallbacks(sink.text()))


# llama-quant.cpp's tensor_type_fallback warning, e.g.
#   warning: blk.1.ffn_down_exps.weight - ncols   1408 not divisible by 256 (required for type    q3_K) -> falling back to    q4_0
_FALLBACK_LINE = re.compile(r"warning: (\S+)\s+- ncols\s+(\d+) not divisible by\s+\d+ \(required for type\s+(\w+)\) "
                            r"(?:\(WARNING: must use F16 due to unusual shape\) )?-> falling back to\s+(\w+)")


def fallbacks(log: str) -> tuple[str, ...]:
    """The quantizer's per-tensor fallbacks in `log`, grouped by tensor (any layer), row length and types."""
    kinds = Counter((re.sub(r"^blk\.\d+\.", "blk.*.", m[1]), int(m[2]), m[3], m[4])
                    for m in _FALLBACK_LINE.finditer(log))
    return tuple(f"{name} (rows of {ncols}): {want} -> {got}, {n} tensor{'s' * (n > 1)}"
                 for (name, ncols, want, got), n in sorted(kinds.items()))


def written_types(path: str | os.PathLike) -> tuple[float, dict[str, int]]:
    """(bits per weight of the matrices, GGML type -> tensor count) of a GGUF as written."""
    import gguf
    reader = gguf.GGUFReader(path)
    bits = n = 0
    types: Counter = Counter()
    for t in reader.tensors:
        if len(t.shape) < 2:
            continue
        types[type_name(t.tensor_type)] += 1
        bits += int(t.n_bytes) * 8
        n += int(t.n_elements)
    return (bits / n if n else 0.0), dict(types)


def _check_disk(src: Path, out: Path, sch: Scheme) -> None:
    """Refuse up front when the output cannot fit (the estimate: the input's size scaled by
    bits per weight, 16-bit input assumed, plus 5%)."""
    from .types import QUANT_TYPES
    need = int(src.stat().st_size * QUANT_TYPES[sch.base].bpw / 16 * 1.05)
    try:
        free = shutil.disk_usage(out.parent if str(out.parent) else ".").free
    except OSError as e:
        raise QuantizeError(f"{out.parent}: cannot write there ({e.strerror or e})") from None
    if free < need:
        raise QuantizeError(f"{out.parent} has {free / 2**30:.1f} GiB free; {out.name} needs about "
                            f"{need / 2**30:.1f} GiB")


class _QuantLog(io.TextIOBase):
    """Where the quantizer's log goes: kept for an error message, and "[ i/ n]" drives the bar."""

    _STEP = re.compile(r"\[\s*(\d+)/\s*(\d+)\]")

    def __init__(self, bar):
        self.bar, self.parts = bar, []

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.parts.append(s)
        for m in self._STEP.finditer(s):
            self.bar.total = int(m[2])
            self.bar.update(int(m[1]) - self.bar.n)
        return len(s)

    def text(self) -> str:
        return "".join(self.parts)


def convert_quantized(checkpoint: str | os.PathLike, out: str | os.PathLike, scheme: str | Scheme, *,
                      imatrix: str | os.PathLike | None = None, tensor_types=(), name: str | None = None,
                      progress: bool = True, verbose: bool = False, say=lambda s: None, mtp: bool = True) -> Path:
    """A Hugging Face checkpoint -> `out` quantized by `scheme`. The types our converter writes
    itself (f32/f16/bf16/q8_0, no rules, no imatrix) are written directly; anything else goes
    through a bf16 intermediate beside `out`, deleted whatever happens. mtp=False: without the
    multi-token-prediction layers (convert --no-mtp)."""
    from ..conversion.convert import convert
    sch = scheme if isinstance(scheme, Scheme) else registry.get(scheme)
    out = Path(out)
    if sch.direct and imatrix is None and not tensor_types:
        say(f"converting to {sch.name}")
        return convert(checkpoint, out, outtype=sch.name, progress=progress, name=name, mtp=mtp)
    tmp = out.with_name(f".{out.stem}.bf16-intermediate-{os.getpid()}.gguf")
    try:
        say("converting to bf16 (intermediate)")
        # an AWQ/GPTQ checkpoint's INT4 weights dequantized too: the quantizer re-quantizes floats
        convert(checkpoint, tmp, outtype="bf16", progress=progress, name=name, exact_int4=False, mtp=mtp)
        say(f"quantizing to {sch.name} with llama.cpp")
        quantize(tmp, out, sch, imatrix=imatrix, tensor_types=tensor_types, progress=progress, verbose=verbose)
    finally:
        tmp.unlink(missing_ok=True)
    return out
