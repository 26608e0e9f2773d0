"""The stock build for --compare-stock: on an AMX CPU it must not be a native build (which aborts
on every DeepSeek-V2 model at this commit) but this CPU's other extensions with AMX off."""
from deepseek_cpu.tools import stock

ZEN4 = {"sse4_2", "avx", "avx2", "bmi2", "fma", "f16c", "avx512f", "avx512cd", "avx512vl", "avx512dq",
        "avx512bw", "avx512vbmi", "avx512_vnni", "avx512_bf16"}


def test_no_amx_cpu_gets_the_native_flags(monkeypatch):
    monkeypatch.setattr(stock, "cpu_flags", lambda: set(ZEN4))
    assert stock.cmake_flags() == stock.CMAKE_FLAGS
    assert not stock.stock_dir("abc").name.endswith("-noamx")


def test_amx_cpu_gets_its_extensions_without_amx(monkeypatch):
    monkeypatch.setattr(stock, "cpu_flags", lambda: ZEN4 | {"amx_tile", "amx_int8", "amx_bf16"})
    flags = stock.cmake_flags()
    assert "-DGGML_NATIVE=ON" not in flags and "-DGGML_NATIVE=OFF" in flags
    for on in ("GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX2", "GGML_FMA"):
        assert f"-D{on}=ON" in flags
    assert "-DGGML_AVX_VNNI=OFF" in flags  # not in ZEN4's flags
    for off in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"):
        assert f"-D{off}=OFF" in flags
    assert stock.stock_dir("abc").name == "stock-abc-noamx"
