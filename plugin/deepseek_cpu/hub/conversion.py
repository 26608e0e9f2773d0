"""The pull's conversion step: architecture pre-flight, convert, llama.cpp quantization.

f32 / f16 / bf16 / q8_0 are written by our converter directly; every other type goes
through a bf16 intermediate that llama.cpp's `llama_model_quantize` quantizes
(quantization/types.py says which is which). Each output is written to a temporary name and
renamed, so an interrupted pull never leaves a truncated GGUF. The converter and
llama_cpp are imported inside the functions: importing this module loads neither.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
from pathlib import Path

from ..quantization import types as quant_types
from ..errors import DeepseekCpuError
from .errors import PullError

INTERMEDIATE = "bf16"


def check_architecture(repo: str, config: dict, client) -> None:
    """Refuse, before any weight is downloaded, a config.json no converter takes (`client`: a HubClient)."""
    from ..conversion.convert import find_converter, supported_architectures
    from ..converters.base import ConversionError, UnsupportedArchitecture
    try:
        find_converter(config, client.storage)
    except UnsupportedArchitecture:
        archs = config.get("architectures") or [config.get("model_type", "unknown")]
        raise PullError(f"{repo}: architecture {', '.join(map(str, archs))} is not supported (supported: "
                        f"{', '.join(supported_architectures())}); no weights were downloaded") from None
    except ConversionError as e:
        raise PullError(f"{repo}: config.json cannot be converted: {str(e).split(': ', 1)[-1]}") from None


def convert_snapshot(snapshot: Path, out: Path, quant: str, progress: bool, verbose: bool, say, name: str) -> None:
    """The downloaded checkpoint at `snapshot` -> `out` in type `quant`."""
    from ..conversion.convert import convert
    try:
        if quant in quant_types.DIRECT:
            say(f"converting to {quant}")
            convert(snapshot, out, outtype=quant, progress=progress, name=name)
        else:
            tmp = out.with_name(f"{out.stem}.{INTERMEDIATE}-intermediate-{os.getpid()}.gguf")
            try:
                say(f"converting to {INTERMEDIATE} (intermediate)")
                convert(snapshot, tmp, outtype=INTERMEDIATE, progress=progress, name=name)
                say(f"quantizing to {quant} with llama.cpp")
                quantize(tmp, out, quant, verbose=verbose, progress=progress)
            finally:
                tmp.unlink(missing_ok=True)
    except PullError:  # quantize()'s own, already worded for the user
        raise
    except DeepseekCpuError as e:  # any converter error (the root spares a list to keep in step)
        raise PullError(f"conversion failed: {e}") from None
    _public_mode(out)


def _public_mode(path: Path) -> None:
    """convert() writes through mkstemp (mode 0600); a cache file should follow the umask."""
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(path, 0o666 & ~mask)
    except OSError:
        pass


def quantize(src: Path, out: Path, quant: str, verbose: bool = False, progress: bool = True,
             nthread: int | None = None) -> Path:
    """llama.cpp's quantizer, `src` GGUF -> `out` (written to a temporary name, then renamed)."""
    import sys

    # llama_cpp on our patched engine, with a log callback that writes to sys.stderr as it
    # is at each call (so redirect_stderr below catches it) and never raises; runtime/llama_log.py,
    # not runtime/llama.py, so the hub never imports llama.py
    from ..runtime import llama_log  # noqa: F401
    import llama_cpp
    from tqdm import tqdm

    from ..runtime.resources import default_threads
    src, out = Path(src), Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    params = llama_cpp.llama_model_quantize_default_params()
    qt = quant_types.QUANT_TYPES.get(quant)
    ftype = getattr(llama_cpp, qt.llama_ftype, None) if qt is not None else None
    if ftype is None:
        raise PullError(f"unknown quantization {quant!r}; choose one of {', '.join(quant_types.NAMES)}")
    params.ftype = ftype
    params.nthread = nthread or default_threads()
    # llama-cpp-python prints llama.cpp's log through a callback to sys.stderr, at or above
    # the level of its "llama-cpp-python" logger: let it all through, into a buffer that
    # drives a progress bar from the "[ i/ n] tensor" lines and keeps the text for errors.
    llog = logging.getLogger("llama-cpp-python")
    level = llog.level
    llog.setLevel(logging.DEBUG)
    bar = tqdm(total=None, unit="tensor", desc=f"{out.name} ({quant})", leave=False, file=sys.stderr,
               disable=verbose or not progress)
    sink = _QuantLog(bar)
    try:
        with (contextlib.nullcontext() if verbose else contextlib.redirect_stderr(sink)):
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
        if rc != 0 or not tmp.is_file():
            lines = [ln.strip() for ln in sink.text().splitlines() if ln.strip()]
            detail = lines[-1] if lines else "no message"
            raise PullError(f"llama.cpp could not quantize to {quant} (code {rc}: {detail}); "
                            "try another --quant, e.g. q8_0")
        os.replace(tmp, out)
    finally:
        bar.close()
        llog.setLevel(level)
        tmp.unlink(missing_ok=True)
    return out


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
