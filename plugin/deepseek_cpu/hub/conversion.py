"""The pull's conversion step: architecture pre-flight, convert, llama.cpp quantization.

f32 / f16 / bf16 / q8_0 are written by our converter directly; every other scheme goes
through a bf16 intermediate that llama.cpp's `llama_model_quantize` quantizes
(quantization/quantize.py), deleted afterwards. Each output is written to a temporary name and
renamed, so an interrupted pull never leaves a truncated GGUF. The converter and
llama_cpp are imported inside the functions: importing this module loads neither.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import DeepseekCpuError
from .errors import PullError

INTERMEDIATE = "bf16"  # what convert_quantized converts to before quantizing


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


def check_scheme(repo: str, config: dict, quant: str) -> None:
    """Refuse, before any weight is downloaded, a scheme that would re-quantize what the release
    already stores in 4 bits (DeepSeek-V4's MXFP4 experts): ds-v4 / mxfp4_moe copy them, the
    converter's own types keep (bf16, q8_0) or widen (f32) them."""
    from ..quantization import registry
    from ..quantization.quantize import _copied_exactly
    if config.get("model_type") != "deepseek_v4":
        return
    sch = registry.get(quant)
    if sch.direct or _copied_exactly(sch, "blk.0.ffn_up_exps.weight", "MXFP4"):
        return
    raise PullError(f"{repo}: DeepSeek-V4 releases its routed experts in MXFP4 already; --quant {quant} would "
                    f"re-quantize them and lose quality: use --quant ds-v4 (keeps them exactly), or bf16 / f32; "
                    f"no weights were downloaded")


def convert_snapshot(snapshot: Path, out: Path, quant: str, progress: bool, verbose: bool, say, name: str,
                     imatrix: Path | None = None) -> None:
    """The downloaded checkpoint at `snapshot` -> `out` quantized by scheme `quant`."""
    from ..quantization.quantize import convert_quantized
    try:
        convert_quantized(snapshot, out, quant, imatrix=imatrix, name=name, progress=progress,
                          verbose=verbose, say=say)
    except DeepseekCpuError as e:  # any converter or quantizer error (the root spares a list to keep in step)
        raise PullError(f"conversion failed: {e}") from None


def quantize(src: Path, out: Path, quant: str, verbose: bool = False, progress: bool = True,
             nthread: int | None = None, imatrix: Path | None = None) -> Path:
    """llama.cpp's quantizer by scheme `quant`, `src` GGUF -> `out` (atomically); a PullError
    saying what failed (quantization/quantize.py does the work)."""
    from ..quantization.quantize import LlamaQuantizeFailed, quantize as run
    try:
        return run(src, out, quant, imatrix=imatrix, nthread=nthread, progress=progress, verbose=verbose).path
    except LlamaQuantizeFailed as e:
        raise PullError(f"{e}; try another --quant, e.g. q8_0") from None
    except DeepseekCpuError as e:
        raise PullError(str(e)) from None
