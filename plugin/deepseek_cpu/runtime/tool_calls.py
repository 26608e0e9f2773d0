"""Tool calls and JSON-schema replies in process, in DeepSeek's own markup (V2.5, V3, R1 templates).

llama-cpp-python's generic chat handler does not know DeepSeek's tool-call markup: it ignores
`tool_choice` "required" and "auto", turns a named function into bare JSON arguments the model
was never trained to write, and ignores `response_format` of type "json_schema". For a model whose
chat template carries DeepSeek's markup, `deepseek_cpu.Llama.create_chat_completion` comes here
and does what `deepseek-cpu serve` does (patches/files/common/parsers/dsc-deepseek-tool-calls.cpp):

  - the prompt is the template rendered as transformers renders it (tools are not described to
    the model, because the template does not describe them);
  - "required" (and a named function, which offers only that tool) constrains the whole reply with
    a grammar: <｜tool▁calls▁begin｜>, then calls whose arguments follow each tool's JSON schema;
  - "auto" generates freely and parses any calls the model writes (the server's grammar switches
    on lazily at <｜tool▁calls▁begin｜>; llama-cpp-python has no lazy grammars, so here a call the
    model starts by itself is not constrained);
  - `response_format` {"type": "json_schema"} constrains the reply to the schema.

The reply is an OpenAI chat completion with `tool_calls` (ids "call_<random>") and finish_reason
"tool_calls"; a call cut off by max_tokens ends with finish_reason "length" and arguments that do
not parse. Streaming yields the text as it comes and each finished call as one delta.
"""
from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any, Iterator

from ..errors import DeepseekCpuError

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"

_CALL = re.compile(re.escape(CALL_BEGIN) + r"(\w+)" + re.escape(SEP) + r"(.+?)\n```json\n(.*?)\s*```" + re.escape(CALL_END),
                   re.DOTALL)
_OPEN_CALL = re.compile(re.escape(CALL_BEGIN) + r"(\w+)" + re.escape(SEP) + r"(.+?)\n```json\n(.*)$", re.DOTALL)


class ToolRequestError(DeepseekCpuError, ValueError):
    """A request whose tools, tool_choice or response_format cannot be used (the server answers 400)."""


def is_deepseek_tool_template(template: str | None) -> bool:
    """The fenced markup of V2.5/V3/R1 (the server's handler, dsc_is_deepseek_tool_call_template, also
    takes V3.1's unfenced markup; in process V3.1, V3.2 and V4 go to runtime/hybrid_chat.py)."""
    return bool(template) and CALLS_BEGIN in template and SEP in template and "```json" in template


def render_prompt(template: str, messages: list[dict], tools: list[dict] | None, bos: str, eos: str,
                  **variables) -> str:
    """The template rendered as transformers 4 renders it: None contents kept (the template
    draws an assistant's tool calls only when its content is None); `variables` are the template's
    own (chat_template_kwargs: V3.1/V3.2/V4's `thinking`, runtime/hybrid_chat.py). A template that
    cannot take a None content beside tool calls (R1-0528's tests `'</think>' in content` on every
    assistant message) is rendered with "" there, as llama-server's generic path renders it."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
    env.filters["from_json"] = json.loads  # V3.2's and V4's templates (llama.cpp's jinja has it)
    env.globals["raise_exception"] = raise_exception
    msgs = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls") and not m.get("content"):
            m["content"] = None
        msgs.append(m)
    tmpl = env.from_string(template)

    def render(msgs):
        return tmpl.render(**variables, messages=msgs, tools=tools, bos_token=bos, eos_token=eos,
                           add_generation_prompt=True)
    try:
        return render(msgs)
    except TypeError:  # None where the template needs a string
        if not any(m.get("tool_calls") and m["content"] is None for m in msgs):
            raise
        return render([{**m, "content": ""} if m.get("tool_calls") and m["content"] is None else m for m in msgs])


def check_tools(tools: list | None, tool_choice: Any) -> tuple[list[dict], str]:
    """Validate the request's tools and tool_choice; returns (the tools offered, "auto"|"required"|"none")."""
    tools = tools or []
    if not isinstance(tools, list):
        raise ToolRequestError("tools: expected a list")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict):
            raise ToolRequestError(f'tools[{i}]: expected {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}')
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ToolRequestError(f"tools[{i}].function.name: required, a non-empty string")
        if "parameters" in fn:
            try:
                _schema_grammar(fn["parameters"])
            except Exception as e:
                raise ToolRequestError(f"tools[{i}].function.parameters: {e}") from None
    if tool_choice is None:
        return tools, "auto" if tools else "none"
    if isinstance(tool_choice, str):
        if tool_choice not in ("auto", "required", "none"):
            raise ToolRequestError(f"tool_choice: {tool_choice!r} is not one of auto, required, none")
        return tools, tool_choice
    name = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str):
        raise ToolRequestError('tool_choice: an object must name a function: {"type": "function", "function": {"name": ...}}')
    chosen = [t for t in tools if t["function"]["name"] == name]
    if not chosen:
        raise ToolRequestError(f"tool_choice: names function '{name}', which is not among the request's tools")
    return chosen, "required"


def _schema_grammar(schema: Any, converter=None, name: str = "") -> str:
    from llama_cpp.llama_grammar import SchemaConverter
    if not isinstance(schema, dict):
        raise ValueError("expected a JSON schema object")
    own = converter is None
    converter = converter or SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    rule = converter.visit(converter.resolve_refs(schema, "request"), name)
    return converter.format_grammar() if own else rule


def _lit(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def tool_call_grammar(tools: list[dict], parallel: bool) -> str:
    """GBNF for a reply that is only tool calls, in DeepSeek's markup."""
    from llama_cpp.llama_grammar import SchemaConverter
    conv = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    alts = []
    for i, t in enumerate(tools):
        fn = t["function"]
        args = _schema_grammar(fn.get("parameters") or {"type": "object"}, conv, f"tool{i}-args")
        alts.append(f'{_lit(CALL_BEGIN + "function" + SEP + fn["name"] + chr(10) + "```json" + chr(10))} {args} '
                    f'{_lit(chr(10) + "```" + CALL_END)}')
    conv._add_rule("call", " | ".join(f"( {a} )" for a in alts))
    more = ' ( "\\n" call )*' if parallel else ""
    conv._add_rule("root", f"{_lit(CALLS_BEGIN)} call{more} {_lit(CALLS_END)}")
    return conv.format_grammar()


def parse_reply(text: str, finished: bool) -> tuple[str | None, list[dict]]:
    """(content before the calls or None, tool calls) of a reply in DeepSeek's markup."""
    at = text.find(CALLS_BEGIN)
    if at < 0:
        return text, []
    content = text[:at] or None
    body = text[at + len(CALLS_BEGIN):]
    calls, end = [], 0
    for m in _CALL.finditer(body):
        calls.append(_call(m.group(2), m.group(3)))
        end = m.end()
    rest = _OPEN_CALL.search(body, end)
    if rest is not None and not finished:  # cut off inside a call: its arguments as far as they go
        calls.append(_call(rest.group(2), rest.group(3)))
    return content, calls


def _call(name: str, arguments: str) -> dict:
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name.strip(), "arguments": arguments.strip()}}


def chat_completion(llm, messages: list[dict], tools=None, tool_choice=None, response_format=None,
                    parallel_tool_calls: bool = False, stream: bool = False, **kwargs):
    """create_chat_completion for DeepSeek's tool-call templates (see the module docstring)."""
    from llama_cpp import LlamaGrammar

    offered, choice = check_tools(tools, tool_choice)
    schema = None
    if response_format is not None:
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        if kind == "json_schema":
            schema = (response_format.get("json_schema") or {}).get("schema", {"type": "object"})
        elif kind == "json_object":
            schema = response_format.get("schema", {"type": "object"})
        elif kind not in ("text", None):
            raise ToolRequestError(f'response_format type must be one of "text", "json_object" or "json_schema", got: {kind}')
        if schema is not None:
            if not isinstance(schema, dict):
                raise ToolRequestError("response_format.json_schema.schema: expected a JSON object")
            try:
                _schema_grammar(schema or {"type": "object"})
            except Exception as e:
                raise ToolRequestError(f"response_format.json_schema.schema: {e}") from None
    template = llm.metadata.get("tokenizer.chat_template")
    bos, eos = llm._model.token_get_text(llm.token_bos()), llm._model.token_get_text(llm.token_eos())
    prompt = render_prompt(template, messages, offered if tools else None, bos, eos)
    grammar = None
    if choice == "required" and offered:
        grammar = LlamaGrammar.from_string(tool_call_grammar(offered, parallel_tool_calls), verbose=False)
    elif schema is not None:
        grammar = LlamaGrammar.from_string(_schema_grammar(schema or {"type": "object"}), verbose=False)
    ids = llm.tokenize(prompt.encode(), add_bos=False, special=True)
    kwargs.pop("grammar", None)
    stop = kwargs.pop("stop", None) or []
    stop = [stop] if isinstance(stop, str) else list(stop)
    # create_chat_completion's max_tokens=None is "up to the context" (create_completion's default is 16)
    gen = llm.create_completion(ids, grammar=grammar, stream=stream, stop=stop,
                                max_tokens=kwargs.pop("max_tokens", None), **kwargs)
    parse = choice != "none" and bool(offered)
    return _stream(gen, parse) if stream else _whole(gen, parse)


def _whole(done: dict, parse: bool) -> dict:
    reply, finish = done["choices"][0]["text"], done["choices"][0].get("finish_reason")
    content, calls = parse_reply(reply, finish != "length") if parse else (reply, [])
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
        if finish == "stop":
            finish = "tool_calls"
    return {"id": "chat" + done["id"], "object": "chat.completion", "created": done["created"],
            "model": done["model"], "usage": done.get("usage"),
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}]}


def _stream(gen: Iterator[dict], parse: bool) -> Iterator[dict]:
    cid, created, sent, text, model = "chatcmpl-" + uuid.uuid4().hex, int(time.time()), 0, "", ""

    def chunk(delta, finish=None):
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    yield chunk({"role": "assistant"})
    finish = None
    for c in gen:
        model = c.get("model", model)
        text += c["choices"][0]["text"]
        finish = c["choices"][0].get("finish_reason") or finish
        if parse and CALLS_BEGIN in text:
            continue  # calls are sent whole, once they end
        # hold back what could be the start of the markers
        safe = len(text) - max((k for k in range(1, len(CALLS_BEGIN)) if parse and text.endswith(CALLS_BEGIN[:k])), default=0)
        if safe > sent:
            yield chunk({"content": text[sent:safe]})
            sent = safe
    content, calls = parse_reply(text, finish != "length") if parse else (text, [])
    if content and len(content) > sent:
        yield chunk({"content": content[sent:]})
    for i, call in enumerate(calls):
        yield chunk({"tool_calls": [{"index": i, **call}]})
    yield chunk({}, "tool_calls" if calls and finish == "stop" else finish)
