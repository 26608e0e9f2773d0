"""A compact, comparable summary of a GGUF file: metadata and per-tensor data hashes.

Used by tests/test_upstream_equivalence.py and by tests/fixtures/make_upstream_reference.py
(which runs under a different interpreter, with the pinned llama.cpp's gguf-py), so it
depends only on gguf, numpy and the standard library.
"""
from __future__ import annotations

import hashlib

import numpy as np


def _value(field):
    """A JSON-able (type, value) pair for a GGUF metadata field."""
    import gguf
    t = gguf.GGUFValueType(field.types[0])
    if t == gguf.GGUFValueType.ARRAY:
        sub = gguf.GGUFValueType(field.types[1]) if len(field.types) > 1 else None
        v = field.contents()
        return [f"ARRAY[{sub.name if sub else '?'}]", v]
    v = field.contents()
    if isinstance(v, (np.floating, float)):
        v = float(v)
    elif isinstance(v, (np.integer, int, np.bool_, bool)) and not isinstance(v, (bool, np.bool_)):
        v = int(v)
    elif isinstance(v, np.bool_):
        v = bool(v)
    return [t.name, v]


def tensor_f32(t) -> np.ndarray:
    """A reader tensor's data as float32 (dequantized where needed)."""
    import gguf
    Q = gguf.GGMLQuantizationType
    if t.tensor_type == Q.F32:
        return np.asarray(t.data, dtype=np.float32)
    if t.tensor_type == Q.F16:
        return np.asarray(t.data).astype(np.float32)
    return gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)


def summarize(path, skip_prefixes=("GGUF.", "tokenizer.")) -> dict:
    """{"metadata": {key: [type, value]}, "tensors": {name: {shape, dtype, sha256}}}.

    `shape` is in GGUF order (ne0 first); `sha256` is over the tensor's float32 bytes in
    C order, so the same numbers stored at another precision hash differently."""
    import gguf
    r = gguf.GGUFReader(str(path))
    meta = {k: _value(f) for k, f in r.fields.items() if not k.startswith(tuple(skip_prefixes))}
    tensors = {}
    for t in r.tensors:
        data = np.ascontiguousarray(tensor_f32(t))
        tensors[t.name] = {
            "shape": [int(x) for x in t.shape],
            "dtype": t.tensor_type.name,
            "sha256": hashlib.sha256(data.tobytes()).hexdigest(),
        }
    return {"metadata": meta, "tensors": tensors}


def value_span(field) -> tuple[int, int]:
    """[start, end) file offsets of a scalar metadata field's value: its last part (tests
    that change a value in place, e.g. the malformed-file and engine-reads-the-key tests)."""
    end = field.offset + sum(int(p.nbytes) for p in field.parts)
    return end - int(field.parts[field.data[0]].nbytes), end
