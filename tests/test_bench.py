"""`deepseek-cpu bench` runs and writes well-formed JSON. Never a timed assertion: the
numbers are only checked to exist and be positive."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from deepseek_cpu import bench, synth

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    # one dense layer of V2-Lite (~0.3 GB): the smallest real-shape file
    return synth.synthesize(tmp_path_factory.mktemp("bench") / "v2-lite-1.gguf", "v2-lite", "q4_0", layers=1,
                            tokenizer="bytes", progress=False)


def test_bench_smoke_json(tiny_model, tmp_path):
    out = tmp_path / "bench.json"
    env_path = str(REPO / "plugin")
    import os
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([env_path] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    p = subprocess.run([sys.executable, "-m", "deepseek_cpu", "bench", str(tiny_model), "--pp", "16", "--tg", "4",
                        "--ctx-depth", "32", "--repeat", "1", "--threads", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["schema"] == bench.SCHEMA
    assert res["settings"]["pp"] == 16 and res["settings"]["tg"] == 4 and res["settings"]["repeat"] == 1
    assert res["model"]["block_count"] == 1 and res["model"]["synthetic_shape"] == "v2-lite"
    ours = res["engines"]["ours"]
    assert list(res["engines"]) == ["ours"] and "ratios_ours_over_stock" not in res
    assert ours["patched"] and ours["build_info"].startswith("deepseek-cpu")
    assert len(ours["runs"]) == 1 and ours["runs"][0]["ok"]
    for m in ("pp_tok_s", "tg_tok_s", "tg_depth_tok_s", "fill_tok_s", "ttft_s", "load_s", "peak_rss_bytes"):
        s = ours["summary"][m]
        assert s["n"] == 1 and s["median"] > 0 and s["min"] <= s["median"] <= s["max"]
    assert "pp16" in p.stdout and "tg4" in p.stdout
    assert res["settings"]["warm_load"] and res["warm_loads"]["ours"]["ok"]
    assert res["warm_loads"]["ours"]["load_s"] > 0 and "pp_tok_s" not in res["warm_loads"]["ours"]
    assert "untimed load ours" in p.stderr


def test_bench_untimed_load_then_order_flips_each_repeat(tmp_path, monkeypatch):
    for d in ("ours", "stock"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "libllama.so").write_bytes(b"")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"not a gguf")
    calls = []

    def fake_run_once(engine, lib, spec, timeout):
        calls.append((engine, bool(spec.get("load_only"))))
        return {"ok": True, "load_s": 1.0, "pp_tok_s": 10.0, "tg_tok_s": 5.0, "tg_depth_tok_s": 4.0, "peak_rss_bytes": 1}

    monkeypatch.setattr(bench, "run_once", fake_run_once)
    res = bench.bench(str(model), repeat=3, compare_stock=True, ours_lib=str(tmp_path / "ours"),
                      stock_lib=str(tmp_path / "stock"), warm_cache=False, log=lambda *a, **k: None)
    assert calls == [("ours", True), ("stock", True),
                     ("ours", False), ("stock", False), ("stock", False), ("ours", False),
                     ("ours", False), ("stock", False)]
    assert len(res["engines"]["ours"]["runs"]) == 3 and res["ratios_ours_over_stock"]["pp_tok_s"] == 1.0
    calls.clear()
    bench.bench(str(model), repeat=1, compare_stock=True, ours_lib=str(tmp_path / "ours"),
                stock_lib=str(tmp_path / "stock"), warm_cache=False, warm_load=False, log=lambda *a, **k: None)
    assert calls == [("ours", False), ("stock", False)]


def _fake_result():
    def eng(scale):
        runs = [{"ok": True, "pp_tok_s": 30.0 * scale * f, "tg_tok_s": 13.0 * scale * f, "ttft_s": 16 / scale,
                 "load_s": 5.0, "peak_rss_bytes": 2**33 / scale} for f in (0.9, 1.0, 1.1)]
        return {"runs": runs, "summary": bench.summarize(runs), "library": "x", "build_info": None, "patched": False}
    res = {"settings": {"pp": 512, "tg": 128, "ctx_depth": 0, "threads": 2, "repeat": 3},
           "model": {"path": "/m.gguf", "size_bytes": 2**33, "name": "m"},
           "engines": {"ours": eng(2.0), "stock": eng(1.0)}}
    so, ss = res["engines"]["ours"]["summary"], res["engines"]["stock"]["summary"]
    res["ratios_ours_over_stock"] = {m: so[m]["median"] / ss[m]["median"] for m in so}
    return res


def test_table_and_ratios():
    res = _fake_result()
    assert res["ratios_ours_over_stock"]["pp_tok_s"] == pytest.approx(2.0)
    t = bench.format_table(res)
    assert "ours/stock" in t and "2.00x" in t and "pp512" in t and "decode at depth" not in t


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    bench.plot(_fake_result(), str(tmp_path / "b.png"))
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
