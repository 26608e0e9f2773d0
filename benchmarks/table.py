"""The README's markdown table from `deepseek-cpu bench --compare-stock --json` files.

    python benchmarks/table.py benchmarks/results/bench-*.json
    python benchmarks/table.py --plot out.png one.json      # the bar chart of one run

One row per engine and file: median over the repeats [min-max], then a row of ratios
ours/stock (speed: >1 is faster; time and memory: <1 is better).
"""
import argparse
import json
from pathlib import Path

COLS = [("pp_tok_s", "pp{pp} tok/s"), ("fill_tok_s", "prefill 0..{depth} tok/s"), ("tg_tok_s", "decode tok/s (after {pp})"),
        ("tg_depth_tok_s", "decode tok/s (at {depth})"), ("ttft_s", "TTFT s ({pp} tok)"),
        ("load_s", "load s"), ("peak_rss_bytes", "peak RSS GB")]


def cell(s, m):
    if not s:
        return "-"
    k = 1e9 if m == "peak_rss_bytes" else 1
    med, lo, hi = s["median"] / k, s["min"] / k, s["max"] / k
    f = (lambda v: f"{v:.2f}") if (m.endswith("_s") and not m.endswith("tok_s")) or k != 1 or med < 10 else (lambda v: f"{v:.1f}")
    return f"{f(med)}" if lo == hi else f"{f(med)} ({f(lo)}–{f(hi)})"


def table(results):
    st = results[0]["settings"]
    cols = [(m, h.format(pp=st["pp"], depth=st["ctx_depth"])) for m, h in COLS
            if any(m in e["summary"] for r in results for e in r["engines"].values())]
    lines = ["| model | engine | " + " | ".join(h for _, h in cols) + " |", "|---|---|" + "---|" * len(cols)]
    for r in results:
        name = f"{Path(r['model']['path']).name} ({r['model']['size_bytes'] / 1e9:.2f} GB)"
        for e, d in r["engines"].items():
            label = "stock llama-cpp-python 0.3.36" if e == "stock" else "deepseek-cpu"
            lines.append(f"| {name} | {label} | " + " | ".join(cell(d["summary"].get(m), m) for m, _ in cols) + " |")
        ratios = r.get("ratios_ours_over_stock")
        if ratios:
            lines.append(f"| {name} | **ours/stock** | " + " | ".join(
                f"**{ratios[m]:.2f}×**" if m in ratios else "-" for m, _ in cols) + " |")
    s = results[0]
    lines.append("")
    reps = "/".join(sorted({str(r["settings"]["repeat"]) for r in results}))
    lines.append(f"{st['threads']} threads, median of {reps} runs each (interleaved), "
                 f"{s['host'].get('cpu', '?')}; every run a fresh process.")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+")
    ap.add_argument("--plot", help="write the bar chart of the (single) JSON here")
    a = ap.parse_args()
    results = [json.loads(Path(p).read_text()) for p in a.json]
    if a.plot:
        from deepseek_cpu.tools.bench import plot
        plot(results[0], a.plot)
    print(table(results))


if __name__ == "__main__":
    main()
