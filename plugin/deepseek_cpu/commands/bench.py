"""`deepseek-cpu bench`: prefill/decode speed, load time and memory, ours against stock (tools/bench.py)."""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..hookspecs import hookimpl
from ..tools.bench import _parse_opts, bench, format_table, plot


@click.command("bench")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--pp", default=512, show_default=True, help="Prompt tokens (one batch; n_batch = n_ubatch = pp).")
@click.option("--tg", default=128, show_default=True, help="Tokens generated one by one.")
@click.option("--threads", type=int, default=None, help="Threads for both engines (default: physical cores).")
@click.option("--repeat", default=3, show_default=True, help="Runs per engine (interleaved with stock).")
@click.option("--ctx-depth", default=4096, show_default=True,
              help="Also decode with this many tokens in the cache (0: skip).")
@click.option("--compare-stock", is_flag=True,
              help="Also run stock llama.cpp (llama-cpp-python 0.3.36 without our patches; built once, cached).")
@click.option("--compare-ik", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Also run ik_llama.cpp's llama-bench from this build directory (its bin/), alternated with ours.")
@click.option("--ik-flags", default=None, metavar="FLAGS",
              help="llama-bench flags for --compare-ik (default: its best CPU settings, -rtr 1 -fmoe 1 -mla 3 -fa 1).")
@click.option("--flash-attn", type=click.Choice(["default", "on", "off"]), default="default", show_default=True,
              help="flash_attn for both engines (default: each engine's own default).")
@click.option("--opt", "opts", multiple=True, metavar="KEY=VALUE",
              help="Extra Llama() argument for both engines (VALUE parsed as JSON), e.g. --opt use_mmap=false.")
@click.option("--mem-budget", default=None, metavar="SIZE",
              help="Ours under a memory budget (Llama(mem_budget=SIZE)); for stock, --stock-opt use_extra_bufts=false "
                   "maps its weights too. benchmarks/mem_budget.py runs both under a real memory limit.")
@click.option("--rpc", "rpc_servers", default=None, metavar="HOST:PORT,...",
              help="Ours split over these `deepseek-cpu rpc-worker`s (Llama(rpc_servers=...)); "
                   "benchmarks/multi_host.py runs them as separate hosts over shaped links.")
@click.option("--rpc-key-file", default=None, metavar="PATH",
              help="With --rpc: the workers' shared key (Llama(rpc_key_file=...); default: $DEEPSEEK_CPU_RPC_KEY_FILE).")
@click.option("--ours-opt", multiple=True, metavar="KEY=VALUE", help="Extra Llama() argument for ours only.")
@click.option("--stock-opt", multiple=True, metavar="KEY=VALUE", help="Extra Llama() argument for stock only.")
@click.option("--ours-lib", type=click.Path(file_okay=False), default=None,
              help="Directory of our libllama.so (default: the installed engine).")
@click.option("--stock-lib", type=click.Path(file_okay=False), default=None,
              help="Directory of a stock libllama.so to use instead of the cached build.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Write all results here.")
@click.option("--plot", "plot_out", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG bar chart here (needs matplotlib: pip install 'deepseek-cpu[bench]').")
@click.option("--seed", default=0, show_default=True, help="Seed of the random prompt.")
@click.option("--timeout", default=3600.0, show_default=True, help="Seconds allowed per run.")
@click.option("--no-warm-cache", is_flag=True, help="Do not read the model into the page cache first.")
@click.option("--mtp", type=click.IntRange(0, 3), is_flag=False, flag_value=1, default=0, metavar="[N]",
              help="Also run ours with N (default 1) MTP drafts a step (engine ours+mtp): greedy decode after a "
                   "text, drafts kept, tokens per step, same tokens or not.")
@click.option("--text", "text_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="With --mtp: the text to continue (default: a built-in Python snippet).")
@click.option("--no-warm-load", is_flag=True,
              help="Skip the untimed first load of each engine (that load pays for page-cache reclaim).")
def bench_cmd(model, pp, tg, threads, repeat, ctx_depth, compare_stock, compare_ik, ik_flags, flash_attn, opts, mem_budget, rpc_servers,
              rpc_key_file, ours_opt,
              stock_opt, ours_lib, stock_lib, json_out, plot_out, seed, timeout, no_warm_cache,
              mtp, text_file, no_warm_load):
    """Prefill/decode tok/s, time to first token, load time and peak RSS of MODEL (a GGUF).

    Each run is a fresh process; with --compare-stock, ours and stock alternate and the
    table shows median [min-max] and the ratio ours/stock; --compare-ik DIR adds an ik_llama.cpp
    build the same way (ratio ours/ik). Never a pass/fail test."""
    if pp < 1 or tg < 1 or repeat < 1 or ctx_depth < 0:
        raise click.BadParameter("--pp, --tg and --repeat must be positive, --ctx-depth >= 0")
    if plot_out:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.ClickException("--plot needs matplotlib: pip install 'deepseek-cpu[bench]'") from None
    try:
        common = _parse_opts(opts)
        if flash_attn != "default":
            common["flash_attn"] = flash_attn == "on"
        res = bench(model, pp=pp, tg=tg, threads=threads, repeat=repeat, ctx_depth=ctx_depth,
                    compare_stock=compare_stock, compare_ik=compare_ik, ik_flags=ik_flags, opts=common,
                    ours_opts={**({"mem_budget": mem_budget} if mem_budget else {}),
                               **({"rpc_servers": rpc_servers} if rpc_servers else {}),
                               **({"rpc_key_file": str(Path(rpc_key_file).resolve())} if rpc_key_file else {}),
                               **_parse_opts(ours_opt)},
                    stock_opts=_parse_opts(stock_opt), ours_lib=ours_lib, stock_lib=stock_lib, seed=seed,
                    timeout=timeout, warm_cache=not no_warm_cache, warm_load=not no_warm_load, mtp=mtp,
                    text=Path(text_file).read_text(encoding="utf-8", errors="replace") if text_file else None,
                    log=lambda m, nl=True: click.echo(m, err=True, nl=nl))
    except (ValueError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from None
    except Exception as e:
        from ..tools.stock import StockBuildError
        if isinstance(e, StockBuildError):
            raise click.ClickException(str(e)) from None
        raise
    click.echo(format_table(res))
    for e, d in res["engines"].items():
        if d.get("ik_settings") is not None or e == "ik":
            click.echo(f"{e}: {d['library']} (ik_llama.cpp {(d.get('ik_settings') or {}).get('build_commit', '?')}, "
                       f"flags {' '.join(res['settings'].get('ik_flags', []))})")
            continue
        click.echo(f"{e}: {d['library']} ({'patched: ' + d['build_info'] if d['patched'] else 'not patched'})"
                   + (f", AMX {d['amx']}" if d.get("amx") else ""))
    if json_out:
        Path(json_out).write_text(json.dumps(res, indent=2))
        click.echo(f"wrote {json_out}")
    if plot_out:
        plot(res, plot_out)
        click.echo(f"wrote {plot_out}")
    failed = [e for e, d in res["engines"].items() if not any(r.get("ok") for r in d["runs"])]
    if failed:
        raise click.ClickException(f"every run of {', '.join(failed)} failed (see above)")


@hookimpl
def deepseek_cpu_register_commands(cli):
    cli.add_command(bench_cmd)
