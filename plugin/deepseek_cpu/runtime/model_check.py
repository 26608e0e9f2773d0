"""What a GGUF's header must hold for the engine not to abort on it: checked before the load.

The engine's loader reports most damage itself ("error loading model: ..."): missing tensors,
wrong shapes (MTP tensors included), impossible hyper-parameters. What it lets through and then
dies on (a GGML_ASSERT or GGML_ABORT, the whole process gone) is checked here, from the header
alone (gguf_header: no libllama, no tensor data), and raised as one MalformedModel line naming the
tensor or key:

  - a 1-D tensor (norm weights, biases, attention sinks, V4's mHC base and scale) that is not F32.
    The graph uses them as the second operand of element-wise ops (ggml_mul in every RMS norm,
    ggml_add for biases) or of ops that assert F32 (sinks, mHC); ggml's CPU binary ops take a
    second operand of F32 only when the first (the activation) is F32, and abort on anything else
    ("ggml_compute_forward_mul: unsupported types"). llama.cpp's converter and quantizer keep every
    1-D tensor F32, so only a hand-made file has one otherwise; a 2-D or larger weight of any type
    is a matrix operand and fine.
  - DeepSeek's MTP ("nextn") layers that do not match `<arch>.nextn_predict_layers`. The loaders of
    deepseek2, deepseek32 and deepseek4 take the last nextn_predict_layers blocks as MTP layers and
    probe the first for `blk.N.nextn.eh_proj.weight`: when it is missing they load the block as
    optional (a file whose MTP tensors were stripped) and the MTP graph then asserts on the null
    tensor; when nextn tensors sit in a block the key calls a main layer, the load fails with only
    "wrong number of tensors". A block the key calls MTP that has no tensors at all is a stripped
    head: not an error (decoding works; runtime/mtp.py says MTP is off).

Shapes are left to the engine: its check_tensor_dims already names the tensor, expected and got.
"""
from __future__ import annotations

import re

import gguf

from ..errors import DeepseekCpuError

# the architectures whose loaders treat the last nextn_predict_layers blocks as MTP layers and
# probe them for eh_proj (llama.cpp src/models/deepseek2.cpp, deepseek32.cpp, deepseek4.cpp)
NEXTN_ARCHS = ("deepseek2", "deepseek32", "deepseek4")
_BLOCK = re.compile(r"blk\.(\d+)\.")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")  # llama.cpp's llama_split_path
_INTEGER_TYPES = {gguf.GGMLQuantizationType.I8, gguf.GGMLQuantizationType.I16,
                  gguf.GGMLQuantizationType.I32, gguf.GGMLQuantizationType.I64}


class MalformedModel(DeepseekCpuError, ValueError):
    """A GGUF the engine would abort on (instead of failing its load): what is wrong, named."""


def mtp_blocks(header) -> range:
    """The blocks the engine's loader takes as MTP layers: the last `<arch>.nextn_predict_layers`
    of `<arch>.block_count` (empty when the key is 0, missing, or larger than the block count,
    which the loader reports itself)."""
    arch = header.arch
    n_all = header.get(f"{arch}.block_count")
    n_nextn = header.get(f"{arch}.nextn_predict_layers") or 0
    if arch not in NEXTN_ARCHS or not isinstance(n_all, int) or not isinstance(n_nextn, int) \
            or not 0 < n_nextn <= n_all:
        return range(0)
    return range(n_all - n_nextn, n_all)


def all_tensors(header) -> list | None:
    """The model's whole tensor table: this file's, or for a split model (llama.cpp's gguf-split,
    `<prefix>-00001-of-0000N.gguf`) every shard's, since a shard holds only some of the tensors;
    None if a shard cannot be read here (the engine's loader then says what is wrong)."""
    n = header.get("split.count") or 1
    if not isinstance(n, int) or n <= 1:
        return list(header.tensors)
    m = _SPLIT.search(header.path.name)
    if not m or int(m.group(2)) != n:
        return None
    from ..gguf_header import read
    tensors = []
    for i in range(1, n + 1):
        shard = header.path.with_name(f"{header.path.name[:m.start()]}-{i:05d}-of-{n:05d}.gguf")
        try:
            tensors += header.tensors if shard == header.path else read(shard).tensors
        except (OSError, ValueError):
            return None
    return tensors


def stripped_mtp_blocks(header, tensors: list | None = None) -> list[int]:
    """MTP blocks (mtp_blocks) with no tensor at all: a head stripped from the file. `tensors`:
    all_tensors(header) if the caller has it."""
    tensors = all_tensors(header) if tensors is None else tensors
    if tensors is None:
        return []
    used = {int(m.group(1)) for t in tensors if (m := _BLOCK.match(t.name))}
    return [i for i in mtp_blocks(header) if i not in used]


def check(header, mtp: bool = False) -> None:
    """Raise MalformedModel if the engine would abort on this file. `mtp`: the MTP layers will be
    loaded and run (Llama(mtp=...)); without it the loader skips their tensors, so only their
    presence is checked, not their types."""
    where = header.path
    tensors = all_tensors(header)
    if tensors is None:  # a shard missing or unreadable: the engine's loader reports it
        return
    _check_nextn_layers(header, tensors, where)
    skipped = set() if mtp else set(mtp_blocks(header))
    for t in tensors:
        if len(t.shape) != 1 or t.type == gguf.GGMLQuantizationType.F32 or t.type in _INTEGER_TYPES:
            continue
        m = _BLOCK.match(t.name)
        if m and int(m.group(1)) in skipped:
            continue
        raise MalformedModel(
            f"{where}: tensor {t.name} is {t.type.name}; the engine's CPU kernels take 1-D tensors (norm "
            f"weights, biases, sinks) as F32 only and would abort on it: convert it to F32")


def _check_nextn_layers(header, tensors, where) -> None:
    arch = header.arch
    if arch not in NEXTN_ARCHS:
        return
    key = f"{arch}.nextn_predict_layers"
    n_nextn = header.get(key) or 0
    n_all = header.get(f"{arch}.block_count")
    mtp = mtp_blocks(header)
    if n_nextn and not mtp:  # a key past the block count: the loader's own hparam check reports it
        return
    said = f"{key} = {n_nextn} ({arch}.block_count = {n_all})"
    blocks: dict[int, set[str]] = {}
    for t in tensors:
        if m := _BLOCK.match(t.name):
            blocks.setdefault(int(m.group(1)), set()).add(t.name)
    for i, names in sorted(blocks.items()):
        nextn = sorted(n for n in names if n.startswith(f"blk.{i}.nextn."))
        if nextn and i not in mtp:
            raise MalformedModel(f"{where}: {nextn[0]} is an MTP tensor, but {said} makes block {i} a main "
                                 f"layer: the key does not match the tensors")
        probe = f"blk.{i}.nextn.eh_proj.weight"
        if i in mtp and probe not in names:
            raise MalformedModel(f"{where}: {said} makes block {i} an MTP layer, but it has no {probe} "
                                 f"(it has {len(names)} other tensors): the key does not match the tensors")


__all__ = ["MalformedModel", "NEXTN_ARCHS", "all_tensors", "check", "mtp_blocks", "stripped_mtp_blocks"]
