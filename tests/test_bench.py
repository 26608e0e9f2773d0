"""`deepseek-cpu bench` runs and writes well-formed JSON. Never a timed assertion: the
numbers are only checked to exist and be positive."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deepseek_cpu.tools import bench, synth

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    # one dense layer of V2-Lite (~0.3 GB): the smallest real-shape file
    return synth.synthesize(tmp_path_factory.mktemp("bench") / "v2-lite-1.gguf", "v2-lite", "q4_0", layers=1,
                            tokenizer="bytes", progress=False)


def test_bench_smoke_json(tiny_model, tmp_path):
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, "-m", "deepseek_cpu", "bench", str(tiny_model), "--pp", "16", "--tg", "4",
                        "--ctx-depth", "32", "--repeat", "1", "--threads", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=900)
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


# Runs as fake child processes would report them. Medians are chosen apart from means and first
# runs, so that a ratio of means or of single runs would show in the table.
GiB = 2**30
FAKE_RUNS = {  # metric -> (ours, stock), one value per repeat
    "pp_tok_s": ([60.0, 90.0, 61.0], [30.5, 30.0, 100.0]),
    "tg_tok_s": ([12.0, 3.0, 9.0], [6.0, 6.0, 1.0]),
    "ttft_s": ([0.25, 0.2, 0.9], [1.0, 0.5, 0.2]),
    "load_s": ([4.0, 4.0, 4.0], [1.0, 1.0, 1.0]),
    "peak_rss_bytes": ([0.75 * GiB] * 3, [3.0 * GiB] * 3),
}


def _bench_on_fake_runs(tmp_path, monkeypatch):
    """bench.bench() with --compare-stock, its child processes replaced by FAKE_RUNS: the
    summaries, ratios and table all come from the code under test."""
    for d in ("ours", "stock"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "libllama.so").write_bytes(b"")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"not a gguf")
    done = {"ours": 0, "stock": 0}

    def fake_run_once(engine, lib, spec, timeout):
        i = done[engine]
        done[engine] += 1
        return {"ok": True, **{m: v[engine == "stock"][i] for m, v in FAKE_RUNS.items()}}

    monkeypatch.setattr(bench, "run_once", fake_run_once)
    return bench.bench(str(model), pp=16, tg=4, threads=2, repeat=3, ctx_depth=0, compare_stock=True,
                       ours_lib=str(tmp_path / "ours"), stock_lib=str(tmp_path / "stock"),
                       warm_cache=False, warm_load=False, log=lambda *a, **k: None)


def test_table_and_ratios(tmp_path, monkeypatch):
    res = _bench_on_fake_runs(tmp_path, monkeypatch)
    # ratios of the medians, worked out by hand from FAKE_RUNS: 61/30.5, 9/6, 0.25/0.5, 4/1, 0.75/3
    assert res["ratios_ours_over_stock"] == pytest.approx(
        {"pp_tok_s": 2.0, "tg_tok_s": 1.5, "ttft_s": 0.5, "load_s": 4.0, "peak_rss_bytes": 0.25})
    rows = {}
    for line in bench.format_table(res).splitlines()[2:]:  # below the header and its rule
        label, *cells = re.split(r"\s{2,}", line.strip())
        rows[label] = cells
    # median [min-max] per engine, then the ratio; no rows for metrics without runs (depth 0)
    assert rows == {
        "pp16 [tok/s]": ["61.0 [60.0-90.0]", "30.5 [30.0-100.0]", "2.00x"],
        "tg4 after 16 [tok/s]": ["9.00 [3.00-12.0]", "6.00 [1.00-6.00]", "1.50x"],
        "TTFT (16-token prompt) [s]": ["0.25 [0.20-0.90]", "0.50 [0.20-1.00]", "0.50x"],
        "load [s]": ["4.00 [4.00-4.00]", "1.00 [1.00-1.00]", "4.00x"],
        "peak RSS [GiB]": ["0.75 [0.75-0.75]", "3.00 [3.00-3.00]", "0.25x"],
    }


def test_plot(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    bench.plot(_bench_on_fake_runs(tmp_path, monkeypatch), str(tmp_path / "b.png"))
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
