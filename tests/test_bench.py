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


# --- bench --compare-ik: ik_llama.cpp's llama-bench as an engine --------------------------------
# The stand-in replays what a real ik_llama.cpp llama-bench (8337e4c, built beside the project)
# printed for `-m v2-lite-q4_0.gguf -t 2 -r 1 -o json -p 16 -n 0 -gp 16,4 -gp 32,4 -rtr 1 -fmoe 1
# -mla 3 -fa 1` (tests/fixtures/ik_llama_bench.json, verbatim), and records the arguments it was given.
IK_OUTPUT = REPO / "tests" / "fixtures" / "ik_llama_bench.json"


def _ik_stand_in(tmp_path, exit_code=0, output=None):
    d = tmp_path / "ik-bin"
    d.mkdir()
    exe = d / "llama-bench"
    exe.write_text(f"#!{sys.executable}\n"
                   "import json, sys\n"
                   f"open({str(d / 'argv.json')!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                   "sys.stderr.write('llama_model_loader: loaded meta data\\n')\n"
                   f"sys.stdout.write(open({str(output or IK_OUTPUT)!r}).read())\n"
                   f"sys.exit({exit_code})\n")
    exe.chmod(0o755)
    return d


def test_compare_ik_runs_its_llama_bench_interleaved(tmp_path, monkeypatch):
    from deepseek_cpu.tools import ik_bench
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "libllama.so").write_bytes(b"")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"not a gguf")
    ik_dir = _ik_stand_in(tmp_path)
    order = []

    def fake_run_once(engine, lib, spec, timeout):
        order.append(engine)
        return {"ok": True, "load_s": 1.0, "pp_tok_s": 100.0, "tg_tok_s": 20.0, "tg_depth_tok_s": 10.0,
                "peak_rss_bytes": 1}

    monkeypatch.setattr(bench, "run_once", fake_run_once)
    real = ik_bench.run_once

    def spy(*args, **kw):
        order.append("ik")
        return real(*args, **kw)
    monkeypatch.setattr(ik_bench, "run_once", spy)
    res = bench.bench(str(model), pp=16, tg=4, ctx_depth=32, threads=2, repeat=2, compare_ik=str(ik_dir),
                      ours_lib=str(tmp_path / "ours"), warm_cache=False, log=lambda *a, **k: None)
    assert order == ["ours", "ik", "ours", "ik", "ik", "ours"]  # untimed loads, then alternated
    calls = [json.loads(x) for x in (ik_dir / "argv.json").read_text().splitlines()]
    assert calls[0][calls[0].index("-p") + 1] == "16" and calls[0][calls[0].index("-gp") + 1] == "16,1"
    timed = calls[1]
    assert timed[timed.index("-m") + 1] == str(model) and timed[timed.index("-t") + 1] == "2"
    assert [timed[i + 1] for i, x in enumerate(timed) if x == "-gp"] == ["16,4", "32,4"]
    assert timed[-8:] == list(ik_bench.IK_DEFAULT_FLAGS) and res["settings"]["ik_flags"] == timed[-8:]
    recorded = json.loads(IK_OUTPUT.read_text())
    want = {(t["n_prompt"], t["n_gen"]): t["avg_ts"] for t in recorded}
    ik = res["engines"]["ik"]
    assert [r["pp_tok_s"] for r in ik["runs"]] == [want[(16, 0)]] * 2
    assert ik["summary"]["tg_tok_s"]["median"] == want[(16, 4)]
    assert ik["summary"]["tg_depth_tok_s"]["median"] == want[(32, 4)]
    assert ik["runs"][0]["peak_rss_bytes"] > 0 and "load_s" not in ik["summary"]
    assert res["ratios_ours_over_ik"]["pp_tok_s"] == pytest.approx(100.0 / want[(16, 0)])
    assert "ours/ik" in bench.format_table(res)


def test_compare_ik_errors_are_one_line(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"not a gguf")
    p = subprocess.run([sys.executable, "-m", "deepseek_cpu", "bench", str(model), "--compare-ik", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert f"--compare-ik {tmp_path}: no executable llama-bench there" in p.stderr


def test_compare_ik_failed_run_is_reported_not_raised(tmp_path):
    from deepseek_cpu.tools import ik_bench
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    exe = ik_bench.ik_bench_path(_ik_stand_in(tmp_path, output=bad))
    spec = {"model": "m.gguf", "pp": 16, "tg": 4, "ctx_depth": 0, "threads": 2}
    res = ik_bench.run_once(exe, spec, [], timeout=60)
    assert not res["ok"] and "lacks pp_tok_s, tg_tok_s" in res["error"]
    exe.write_text(exe.read_text().replace("sys.exit(0)", "sys.exit(3)"))
    res = ik_bench.run_once(exe, spec, [], timeout=60)
    assert not res["ok"] and res["error"] == "llama-bench exited 3" and res["stderr_tail"]
