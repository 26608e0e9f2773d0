"""The report of `deepseek-cpu bench` (tools/bench.py): the metrics, the table and the chart
of a result."""
from __future__ import annotations

import statistics
from pathlib import Path

# metric -> (label, unit, higher is better)
METRICS = {
    "pp_tok_s": ("prefill", "tok/s", True),
    "tg_tok_s": ("decode", "tok/s", True),
    "tg_depth_tok_s": ("decode at depth", "tok/s", True),
    "tg_text_tok_s": ("decode of text", "tok/s", True),
    "mtp_acceptance": ("MTP drafts kept", "%", True),
    "mtp_tokens_per_step": ("tokens per decode step", "tok", True),
    "fill_tok_s": ("prefill to depth", "tok/s", True),
    "ttft_s": ("time to first token", "s", False),
    "first_prefill_s": ("first (cold) prefill", "s", False),
    "load_s": ("load", "s", False),
    "peak_rss_bytes": ("peak RSS", "GiB", False),
}


# result keys of the ratio columns: ratios_A_over_B -> "A/B" (metric -> median A / median B)
RATIOS = ("ratios_ours_over_stock", "ratios_ours_over_ik", "ratios_ours_mtp_over_ours")


def _fmt(m: str, v: float) -> str:
    if m == "mtp_acceptance":
        return f"{100 * v:.1f}"
    if m == "peak_rss_bytes":
        return f"{v / 2**30:.2f}"
    if m.endswith("_s") and not m.endswith("tok_s"):
        return f"{v:.2f}"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def metric_label(m: str, settings: dict) -> str:
    label, unit, _ = METRICS[m]
    pp, tg, d = settings["pp"], settings["tg"], settings["ctx_depth"]
    label = {"pp_tok_s": f"pp{pp}", "tg_tok_s": f"tg{tg} after {pp}", "tg_depth_tok_s": f"tg{tg} at depth {d}",
             "fill_tok_s": f"prefill 0..{d}", "ttft_s": f"TTFT ({pp}-token prompt)",
             "tg_text_tok_s": f"tg{tg} after text (greedy)"}.get(m, label)
    return f"{label} [{unit}]"


def format_table(result: dict) -> str:
    engines = list(result["engines"])
    st = result["settings"]
    ratios = [(k, f"{k.split('_over_')[0].removeprefix('ratios_')}/{k.split('_over_')[1]}".replace("ours_mtp", "ours+mtp"))
              for k in RATIOS if k in result]
    rows = [["metric"] + [f"{e} median [min-max]" for e in engines] + [name for _, name in ratios]]
    for m in METRICS:
        cells = []
        for e in engines:
            s = result["engines"][e]["summary"].get(m)
            cells.append(f"{_fmt(m, s['median'])} [{_fmt(m, s['min'])}-{_fmt(m, s['max'])}]" if s else "-")
        if all(c == "-" for c in cells):
            continue
        row = [metric_label(m, st)] + cells
        for k, _ in ratios:
            r = result[k].get(m)
            row.append(f"{r:.2f}x" if r else "-")
        rows.append(row)
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in rows]
    lines.insert(1, "  ".join("-" * x for x in w))
    shares = [x["experts_top10pct_share"] for x in result["engines"].get("ours", {}).get("runs", [])
              if "experts_top10pct_share" in x]
    if shares:  # what the random prompt's routing looked like (uniform: 10%)
        lines.append(f"routing: the most used 10% of each layer's experts took {100 * statistics.median(shares):.1f}% "
                     "of its routings (uniform: 10%; deepseek-cpu experts shows more)")
    same = result.get("mtp_same_tokens")
    if same is not None:
        lines.append("MTP: the same greedy tokens as without it" if same else
                     "MTP: greedy tokens DIFFER from those without it (see the runs' text_tokens)")
    return "\n".join(lines)


def plot(result: dict, out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    engines = list(result["engines"])
    st = result["settings"]
    speed = [m for m in ("pp_tok_s", "tg_tok_s", "tg_depth_tok_s") if any(m in result["engines"][e]["summary"] for e in engines)]
    other = [m for m in ("ttft_s", "load_s", "peak_rss_bytes") if any(m in result["engines"][e]["summary"] for e in engines)]
    fig, axes = plt.subplots(1, len(speed) + len(other), figsize=(3.0 * (len(speed) + len(other)), 4.2))
    colors = {"ours": "#2b7bba", "stock": "#999999", "ik": "#d9822b"}
    for ax, m in zip(axes, speed + other):
        meds, lo, hi = [], [], []
        for e in engines:
            s = result["engines"][e]["summary"].get(m)
            k = 2**30 if m == "peak_rss_bytes" else 1
            meds.append(s["median"] / k if s else 0)
            lo.append((s["median"] - s["min"]) / k if s else 0)
            hi.append((s["max"] - s["median"]) / k if s else 0)
        ax.bar(engines, meds, yerr=[lo, hi], capsize=4, color=[colors.get(e, "#555") for e in engines])
        ax.set_title(metric_label(m, st), fontsize=9)
        for i, v in enumerate(meds):
            ax.text(i, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
        ratios = [f"ours/{b} {result[f'ratios_ours_over_{b}'][m]:.2f}x" for b in ("stock", "ik")
                  if result.get(f"ratios_ours_over_{b}", {}).get(m)]
        if ratios:
            ax.set_xlabel(", ".join(ratios), fontsize=8)
    name = result["model"].get("name") or Path(result["model"]["path"]).name
    fig.suptitle(f"{name} ({Path(result['model']['path']).name}, {result['model']['size_bytes'] / 2**30:.2f} GiB), "
                 f"{st['threads']} threads, median of {st['repeat']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
