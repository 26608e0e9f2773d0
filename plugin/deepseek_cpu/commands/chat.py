"""`deepseek-cpu chat MODEL`: an interactive chat in the terminal.

Each line you type is a user turn; the reply streams as it is generated, followed by
`[N tokens, X tok/s]` on stderr. The model's own chat template (from the GGUF) formats
the conversation, as transformers' apply_chat_template would. Commands: /reset clears
the conversation, /exit (or end of input) quits. A reply that reaches the context ends
with "[context full]"; /reset to continue.
"""
from __future__ import annotations

import sys
import time

import click

from ..hookspecs import hookimpl
from .options import open_terminal_model, terminal_options


def chat_loop(llm, lines, echo=click.echo, system: str | None = None, max_tokens: int = 512,
              temperature: float = 0.0, prompt: str = "> ") -> list[dict]:
    """Run the conversation over `lines` (an iterator of user inputs); returns the messages."""
    base = [{"role": "system", "content": system}] if system else []
    messages = list(base)
    while True:
        echo(prompt, nl=False, err=True)
        try:
            line = next(lines)
        except StopIteration:
            echo("", err=True)
            break
        line = line.rstrip("\n")
        if not line.strip():
            continue
        if line.strip() in ("/exit", "/quit"):
            break
        if line.strip() == "/reset":
            messages = list(base)
            echo("[conversation cleared]", err=True)
            continue
        messages.append({"role": "user", "content": line})
        t0, n, reply, finish = time.perf_counter(), 0, [], None
        try:
            for chunk in llm.create_chat_completion(messages=messages, max_tokens=max_tokens,
                                                    temperature=temperature, stream=True):
                choice = chunk["choices"][0]
                text = choice.get("delta", {}).get("content")
                if text:
                    echo(text, nl=False)
                    reply.append(text)
                    n += 1
                finish = choice.get("finish_reason") or finish
        except ValueError as e:  # the conversation alone no longer fits the context
            messages.pop()
            echo(f"\n[{e}; /reset to start over]", err=True)
            continue
        dt = time.perf_counter() - t0
        messages.append({"role": "assistant", "content": "".join(reply)})
        tail = " [context full]" if finish == "length" and _ctx_full(llm) else ""
        echo("", nl=True)
        echo(f"[{n} tokens in {dt:.2f} s, {n / dt if dt > 0 else 0:.1f} tok/s]{tail}", err=True)
    return messages


def _ctx_full(llm) -> bool:
    try:
        return llm.n_tokens >= llm.n_ctx() - 1
    except Exception:
        return False


@click.command()
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--system", default=None, help="System message.")
@click.option("-n", "--max-tokens", default=512, show_default=True, help="Per reply.")
@click.option("--temperature", default=0.0, show_default=True)
@terminal_options
def chat(model, system, max_tokens, temperature, threads, n_ctx, mem_budget, prefetch, mtp, repack_cache):
    """Chat with MODEL (a GGUF) in the terminal, streaming replies; tokens/s after each."""
    llm = open_terminal_model(model, threads, n_ctx, mem_budget, prefetch, mtp, repack_cache)
    click.echo(f"chatting with {model} (n_ctx {llm.n_ctx()}); /reset, /exit", err=True)
    chat_loop(llm, iter(sys.stdin), system=system, max_tokens=max_tokens, temperature=temperature)


@hookimpl
def deepseek_cpu_register_commands(cli):
    cli.add_command(chat)
