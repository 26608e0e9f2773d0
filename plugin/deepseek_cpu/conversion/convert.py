"""HF checkpoint directory -> GGUF file, streamed tensor by tensor, written atomically.

    from deepseek_cpu import convert
    convert("DeepSeek-V2-Lite/", "v2-lite.gguf", outtype="bf16")

The converter for the checkpoint is chosen by the `deepseek_cpu_converter` hook, so a
plugin can add architectures. An interrupted or failed conversion leaves nothing at
the output path.

INT4 checkpoints (config.json `quantization_config` with quant_method "gptq", "awq" or
"compressed-tensors" pack-quantized) are detected from config.json; no option asks for
it. Their quantized Linears keep their integer groups EXACTLY as q4_1 blocks (q4_0 when
symmetric) whatever `outtype` says -- re-quantizing an INT4 grid to another type only adds
error -- and `outtype` applies to everything else: the unquantized modules (embeddings,
norms, router, lm_head, ...) and the quantized tensors that cannot stay exact (act-order
groups, 8-bit codes, MLA's transposed attn_k_b...), which are dequantized first and each
logged with the reason (logger "deepseek_cpu.conversion"). general.file_type then says
q4_1 / q4_0, the type of the bulk of the weights. Settings that cannot be read (3-bit
codes, an unknown quant_method or format) raise UnsupportedQuantization naming the
config field and value, before anything is written. See converters/quantized.py.

FP8 checkpoints as DeepSeek publishes V3, R1, V3.1 and V3.2 (quant_method "fp8": e4m3 weights
with a float32 scale per 128x128 block) are read to float32, each weight times its block's
scale, and converted like a float checkpoint (converters/fp8.py).
"""
from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import gguf
import numpy as np

from .. import plugins
from ..atomic import partial_path
from ..converters.base import OUTTYPES, ConversionError, EncodedBlocks, UnsupportedArchitecture, encode_pieces
from ..converters.checkpoint import CheckpointError
from ..converters.quantized import UnsupportedQuantization, open_checkpoint
from ..converters import tokenizer as tk
from ..quantization.types import QUANT_TYPES

log = logging.getLogger("deepseek_cpu.conversion")

__all__ = ["convert", "ConversionError", "UnsupportedArchitecture", "UnsupportedQuantization", "CheckpointError",
           "read_config", "find_converter"]


def read_config(model_dir: Path) -> dict:
    model_dir = Path(model_dir)
    if not model_dir.exists():
        raise ConversionError(f"{model_dir}: no such directory")
    if not model_dir.is_dir():
        raise ConversionError(f"{model_dir}: not a directory (give the checkpoint directory)")
    path = model_dir / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConversionError(f"{model_dir}: no config.json; is this a Hugging Face checkpoint?") from None
    except OSError as e:  # permission denied, a directory, an I/O error
        raise ConversionError(f"{path}: cannot read ({e.strerror or e})") from None
    except ValueError as e:
        raise ConversionError(f"{path}: not valid JSON ({e})") from None


def supported_architectures() -> list[str]:
    pm = plugins.load()
    return sorted({a for lst in pm.hook.deepseek_cpu_supported_architectures() for a in (lst or [])})


def find_converter(config: dict, model_dir: Path):
    pm = plugins.load()
    conv = pm.hook.deepseek_cpu_converter(config=config, model_dir=Path(model_dir))
    if conv is None:
        archs = config.get("architectures") or [config.get("model_type", "unknown")]
        raise UnsupportedArchitecture(
            f"{model_dir}: architecture {', '.join(map(str, archs))} is not supported; "
            f"supported: {', '.join(supported_architectures())}")
    return conv


def _tensor_transforms(conv) -> list:
    pm = plugins.load()
    return [f for lst in pm.hook.deepseek_cpu_tensor_transforms(converter=conv) for f in (lst or [])]


def convert(model_dir: str | os.PathLike, out_path: str | os.PathLike, outtype: str = "f32",
            progress: bool = True, name: str | None = None, exact_int4: bool = True, mtp: bool = True) -> Path:
    """Convert a checkpoint directory to a GGUF at `out_path`; returns the path.

    `name` (e.g. the hub repo id) becomes general.name; by default config.json's
    `_name_or_path`, else the directory's name. exact_int4=False dequantizes an INT4
    checkpoint's weights to `outtype` too (a float intermediate for llama.cpp's quantizer,
    which refuses to re-quantize q4 blocks); the default keeps them exact (module docstring).
    mtp=False leaves out the multi-token-prediction (MTP / nextn) layers of V3 / R1 / V3.1 / V3.2 /
    V4, which are kept by default (block_count = main layers + nextn_predict_layers)."""
    model_dir, out_path = Path(model_dir), Path(out_path)
    if outtype not in OUTTYPES:
        raise ConversionError(f"unknown outtype {outtype!r}; choose one of {', '.join(OUTTYPES)}")
    config = read_config(model_dir)
    if name:  # transformers' own key for where a model came from; converters read it
        config = {**config, "_name_or_path": name}
    conv = find_converter(config, model_dir)
    if hasattr(conv, "keep_mtp"):  # a plugin's converter may have no MTP to keep
        conv.keep_mtp = mtp
    tok = tk.read_tokenizer(model_dir, int(config.get("vocab_size", 0)))
    ckpt = open_checkpoint(model_dir, config, exact=exact_int4)
    try:
        plans = conv.plan(ckpt, OUTTYPES[outtype])
    except BaseException:
        ckpt.close()
        raise
    transforms = _tensor_transforms(conv)

    out_dir = out_path.parent if str(out_path.parent) else Path(".")
    if not out_dir.is_dir():
        raise ConversionError(f"{out_dir}: output directory does not exist")
    if out_path.is_dir():
        raise ConversionError(f"{out_path}: is a directory; give the output file's name")
    tmp = partial_path(out_path)
    writer = gguf.GGUFWriter(None, conv.arch)
    try:
        writer.add_file_type(int(_file_type(outtype, plans)))
        # the block layout's revision; llama.cpp's converter writes it for every file type
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        conv.write_metadata(writer)
        tk.write_tokenizer(writer, tok)
        for p in plans:
            dtype = _storage_dtype(p.qtype)
            writer.add_tensor_info(p.name, _stored_shape(p.shape, p.qtype, dtype), dtype, p.nbytes, raw_dtype=p.qtype)
        writer.open_output_file(tmp)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        total = sum(p.nbytes for p in plans)
        bar = _bar(total, out_path.name, progress)
        for p in plans:
            data = p.produce()
            if isinstance(data, EncodedBlocks):
                data = _transform_encoded(p, data, transforms)
            else:
                for fn in transforms:
                    data = fn(p.name, data)
            if not isinstance(data, EncodedBlocks) and tuple(data.shape) != p.shape:
                raise ConversionError(f"tensor {p.name}: produced shape {data.shape}, planned {p.shape}")
            writer.write_tensor_data(_Encoded(p.name, data, p.qtype, p.nbytes))
            del data
            for src in p.sources:  # its checkpoint pages need not stay resident
                ckpt.drop_pages(src)
            bar.update(p.nbytes)
            bar.set_postfix_str(p.name, refresh=False)
        bar.close()
        finish_gguf(writer, tmp, out_path)
    except OSError as e:
        _discard(writer, tmp)
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise ConversionError(f"{out_dir}: no space left while writing {out_path.name} "
                                  f"({_gib(sum(p.nbytes for p in plans))} GiB needed); nothing was written") from None
        raise
    except BaseException:
        _discard(writer, tmp)
        raise
    finally:
        ckpt.close()
    return out_path


class _Encoded:
    """A tensor as GGUFWriter.write_tensor_data uses it (`nbytes`, `tofile`), encoded to
    its GGUF type piece by piece while it is written: the encoded copy never exists whole,
    so peak memory is the float32 tensor plus a few MB. Writing through the file object
    also keeps ENOSPC / EFBIG in the OSError, which numpy's tofile() reports without errno."""

    def __init__(self, name: str, data: np.ndarray, qtype: gguf.GGMLQuantizationType, nbytes: int):
        self.name, self.data, self.qtype, self.nbytes = name, data, qtype, nbytes

    def tofile(self, fid) -> None:
        written = 0
        pieces = [self.data.data] if isinstance(self.data, EncodedBlocks) else encode_pieces(self.data, self.qtype)
        for piece in pieces:
            fid.write(memoryview(np.ascontiguousarray(piece)).cast("B"))
            written += piece.nbytes
        if written != self.nbytes:
            raise ConversionError(f"tensor {self.name}: encoded to {written} bytes, planned {self.nbytes}")


def finish_gguf(writer: gguf.GGUFWriter, tmp: Path, out_path: Path) -> None:
    """Make a fully written temp GGUF durable, then move it into place in one step."""
    for f in writer.fout or []:
        f.flush()
        os.fsync(f.fileno())
    writer.close()
    os.replace(tmp, out_path)


def _discard(writer: gguf.GGUFWriter, tmp: Path) -> None:
    try:
        writer.close()
    except Exception:
        pass
    tmp.unlink(missing_ok=True)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def _storage_dtype(qtype: gguf.GGMLQuantizationType):
    Q = gguf.GGMLQuantizationType
    return {Q.F32: np.float32, Q.F16: np.float16}.get(qtype, np.uint8)


def _stored_shape(shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType, dtype) -> tuple[int, ...]:
    """gguf-py takes block-quantized tensors by their byte shape."""
    if dtype is not np.uint8:
        return shape
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    return (*shape[:-1], shape[-1] // block * type_size)


def _transform_encoded(p, data: EncodedBlocks, transforms: list):
    """Plugins' tensor transforms work on float32: they get the blocks dequantized. One
    that returns its input unchanged keeps the exact blocks; a changed tensor is
    re-encoded in the plan's type (so no longer bit-exact) and said so."""
    if not transforms:
        return data
    flat = gguf.quants.dequantize(data.data, p.qtype).reshape(p.shape)
    out = flat
    for fn in transforms:
        out = fn(p.name, out)
    if out is flat:
        return data
    log.warning("%s: a tensor transform changed the exact INT4 blocks; re-quantized to %s", p.name, p.qtype.name.lower())
    return out


def _file_type(outtype: str, plans=()) -> gguf.LlamaFileType:
    """outtype's file type; for an INT4 import the type of its exact blocks (q4_1 or q4_0)."""
    Q = gguf.GGMLQuantizationType
    kept = {p.qtype for p in plans} & {Q.Q4_0, Q.Q4_1}
    if kept:
        return QUANT_TYPES["q4_1" if Q.Q4_1 in kept else "q4_0"].file_type
    return QUANT_TYPES[outtype].file_type


def _bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                disable=not enabled, leave=False)

