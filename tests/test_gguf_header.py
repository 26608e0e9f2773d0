"""deepseek_cpu.gguf_header reads what gguf-py's GGUFReader reads (its oracle), fast, and turns a
damaged header into a GGUFHeaderError."""
import gguf
import pytest

from deepseek_cpu import gguf_header


def _reader_fields(r):
    out = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):  # GGUFReader's own entries for the file header
            continue
        out[k] = ("array", len(f.data)) if f.types and f.types[0] == gguf.GGUFValueType.ARRAY else f.contents()
    return out


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_same_fields_and_tensors_as_gguf_py(converted, outtype):
    path = converted("v2_lite", outtype)
    r = gguf.GGUFReader(str(path), "r")
    h = gguf_header.read(path)
    want = _reader_fields(r)
    assert set(h.fields) == set(want)
    for k, v in want.items():
        assert h.fields[k] == (pytest.approx(v) if isinstance(v, float) else v), k
    assert [(t.name, t.shape, t.type, t.offset, t.nbytes) for t in h.tensors] == \
           [(t.name, tuple(int(x) for x in t.shape), t.tensor_type, int(t.data_offset), int(t.n_bytes)) for t in r.tensors]
    assert h.arch == "deepseek2"


@pytest.mark.parametrize("cut", [3, 20, 200, 5000])
def test_a_cut_header_is_a_clear_error(converted, tmp_path, cut):
    src = converted("v2_lite", "f32").read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(src[:cut])
    with pytest.raises(gguf_header.GGUFHeaderError, match="cut.gguf"):
        gguf_header.read(bad)


def test_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(gguf_header.GGUFHeaderError, match="not a GGUF"):
        gguf_header.read(p)
