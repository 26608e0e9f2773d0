"""`deepseek-cpu serve MODEL`: llama-server with our defaults (the library side: runtime/serve.py)."""
from __future__ import annotations

import shlex
import sys

import click

from ..hookspecs import hookimpl
from ..runtime import serve
from .options import REPACK_CACHE_OPTION, cpu_set_option


def say(message: str) -> None:
    click.echo(f"deepseek-cpu serve: {message}", err=True)


@click.command("serve", context_settings={"ignore_unknown_options": True})
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--parallel", "-np", default=serve.DEFAULT_PARALLEL, show_default=True, type=click.IntRange(1, 256),
              help="Slots: requests decoded concurrently (continuous batching).")
@click.option("--ctx", "ctx_per_slot", type=click.IntRange(16, None), default=None,
              help=f"Context per slot (default: fits memory, {serve.MIN_CTX_PER_SLOT}..{serve.MAX_CTX_PER_SLOT}).")
@click.option("--threads", type=int, default=None, help="Default: physical cores available (among --cpus).")
@click.option("--cpus", default=None, metavar="LIST",
              help="Run the server on these CPUs only, e.g. 0-7 or 0,2,4 (its threads default to their physical cores).")
@click.option("--alias", default=None, help="Model name reported by /v1/models.")
@click.option("--ready-timeout", default=600.0, show_default=True, help="Seconds to wait for /health.")
@click.option("--mem-budget", default=None, metavar="SIZE",
              help="Run within SIZE of memory (e.g. 4G): the routed experts used from the file mapping, not copied.")
@click.option("--prefetch", default=None, metavar="POLICY",
              help="Prefetch policy under --mem-budget (default: popular); the server's pages are read ahead, not locked.")
@click.option("--rpc", "rpc_servers", default=None, metavar="HOST:PORT,...",
              help="Split the layers over these `deepseek-cpu rpc-worker`s, by the memory each offers.")
@click.option("--rpc-local", default=None, metavar="SIZE",
              help="With --rpc: memory this host gives to layers (default: none but the embeddings).")
@click.option("--rpc-key-file", default=None, metavar="PATH",
              help="With --rpc: the workers' shared key (their --key-file; default: $DEEPSEEK_CPU_RPC_KEY_FILE).")
@click.option("--api-key", default=None, metavar="KEY",
              help=f"Require this API key (comma-separated: several), as `Authorization: Bearer KEY`. "
                   f"Prefer --api-key-file or ${serve.ENV_API_KEY}: other users can read a command line.")
@click.option("--api-key-file", default=None, metavar="PATH",
              help="Require the keys in PATH (one a line, '#' comments), a file only you may read (chmod 600).")
@click.option("--insecure", is_flag=True,
              help="Allow a non-loopback --host without an API key (anyone who reaches the port may use it).")
@click.option("--no-webui", is_flag=True, help="The API only: no chat page at http://HOST:PORT/.")
@click.option("--mtp", type=click.IntRange(0, 3), is_flag=False, flag_value=1, default=0, metavar="[N]",
              help="Draft N tokens (default 1) a step with the model's multi-token-prediction head "
                   "(llama-server's draft-mtp); the same replies, more tokens per step.")
@REPACK_CACHE_OPTION
@click.option("--dry-run", is_flag=True, help="Print the llama-server command line and exit.")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def serve_cmd(model, host, port, parallel, ctx_per_slot, threads, cpus, alias, mem_budget, prefetch, ready_timeout,
              rpc_servers, rpc_local, rpc_key_file, api_key, api_key_file, insecure, no_webui, mtp, repack_cache, dry_run, extra):
    """Serve MODEL (a GGUF) over an OpenAI-compatible HTTP API with llama-server.

    On an address other machines can reach, an API key is required (or --insecure), and no other
    web site's page may read the API from a browser (CORS: localhost origins only).

    A chat page is served at http://HOST:PORT/ (--no-webui: the API only); with an API key it
    loads without one, and asks for it.

    Flags after `--` go to llama-server unchanged, e.g. `-- --context-shift`."""
    from ..gguf_header import read
    keys = serve.api_keys(api_key, api_key_file)  # first: a bad key file is reported before any work
    serve.check_exposure(host, keys, extra, insecure)
    cpu_set = cpu_set_option(cpus)
    if cpu_set:
        from ..runtime.resources import default_threads
        threads = threads or default_threads(cpu_set)
    if rpc_servers and mem_budget:
        raise click.UsageError("--rpc and --mem-budget cannot be combined (the workers hold the layers in memory)")
    if rpc_key_file and not rpc_servers:
        raise click.UsageError("--rpc-key-file goes with --rpc")
    try:
        header = read(model)  # once: the context, the budget and the split are all sized from it
    except (OSError, ValueError):
        header = None  # each step then says what it cannot do with the file, as before
    env = serve.budget_env(model, mem_budget, prefetch, parallel, ctx_per_slot, dry_run, header, say) if mem_budget else {}
    if repack_cache is not None:
        from ..runtime.repack_cache import ENV, directory
        env[ENV] = directory(repack_cache)
    workers = None
    if rpc_servers:
        from ..runtime import rpc_serve
        ctx_per_slot = ctx_per_slot or serve.rpc_ctx_per_slot(model, header)
        workers, rpc_args, rpc_env = rpc_serve.server_args(model, rpc_servers, rpc_local, ctx_per_slot * parallel,
                                                           header, say, rpc_key_file)
        extra = (*rpc_args, *extra)
        env.update(rpc_env)
    if mtp and header is not None:
        from ..runtime.mtp import unavailable_reason
        reason = unavailable_reason(header)
        if reason:
            say(f"MTP off: {reason}")
            mtp = 0
    if header is not None:
        # what llama-server would abort on (a non-F32 norm, MTP layers out of step with their key), as one
        # line before it starts: Llama() makes the same check (runtime/model_check.py)
        from ..runtime.model_check import check
        check(header, mtp=bool(mtp))
    prompt_cache = None
    if mem_budget and header is not None:
        # the prompt cache's share of the budget, not of the machine's memory
        from ..runtime import memory_budget
        from ..runtime.model_file import prompt_cache_bytes, read_shape
        hot, _ = memory_budget.tensor_bytes(model, header)
        ctx = (ctx_per_slot or serve.default_ctx_per_slot(model, parallel, header)) * parallel
        prompt_cache = prompt_cache_bytes(read_shape(model, header), ctx, available=memory_budget.parse_size(mem_budget),
                                          weights=hot)
    cmd = serve.build_command(model, host, port, parallel, ctx_per_slot, threads, alias, extra, header,
                              api_key=bool(keys), webui=not no_webui, mtp=mtp, prompt_cache=prompt_cache)
    if dry_run:
        pin = ["taskset", "-c", cpus] if cpu_set else []
        click.echo(" ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), *pin, *map(shlex.quote, cmd)]))
        return
    sys.exit(serve.run_server(cmd, host, port, ready_timeout, env, cpu_set, workers, say, api_keys=keys))


@hookimpl
def deepseek_cpu_register_commands(cli):
    cli.add_command(serve_cmd)
