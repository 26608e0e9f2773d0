"""Chat in process for DeepSeek's hybrid-thinking templates: V3.1, V3.2 and V4 (issue #48).

`deepseek_cpu.Llama.create_chat_completion` comes here for a model whose chat template is one of
them, for every request, and answers as `deepseek-cpu serve` does:

  - the prompt is the template rendered as transformers renders it, with the template's own
    variables: thinking is off unless the request turns it on, with
    `chat_template_kwargs={"thinking": True}` (DeepSeek's name) or `{"enable_thinking": True}`,
    or `reasoning_effort` other than "none" (V4's template also reads "max");
  - in thinking mode the thought comes back in `message["reasoning_content"]` (streamed as
    `delta["reasoning_content"]`), never in `content`; `thinking_budget_tokens` bounds it (then
    `</think>` is written for the model, as the server does);
  - tool calls are the template's own markup: V3.1's
    `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>...`, V3.2's and
    V4's DSML (`<｜DSML｜function_calls>` / `<｜DSML｜tool_calls>`, `<｜DSML｜invoke name=...>`,
    one `<｜DSML｜parameter ...>` per argument), constrained by a grammar built from the tools'
    JSON schemas (after the thought, in thinking mode) and parsed into OpenAI `tool_calls`;
  - tool_choice "required" or a named function: the reply (after the thought) is the call;
    "auto": free text, and from the call markup on the grammar holds (the server's lazy grammar,
    done here by stopping at the marker and going on under the grammar); "none": plain text;
  - `response_format` with a JSON schema constrains the answer (V3.2/V4 write it fenced as
    ```json ... ```, as the server's grammar does; `content` is the JSON).

Requests the server refuses with a 400 raise ToolRequestError (a ValueError) naming the field.
"""
from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any, Iterator

from .tool_calls import (CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, SEP, ToolRequestError, _lit, check_tools,
                         render_prompt)

THINK_START, THINK_END = "<think>", "</think>"
DSML = "｜DSML｜"
PARAM_END = "</" + DSML + "parameter>"
_EFFORTS_OFF = ("none",)


def template_kind(template: str | None) -> str | None:
    """"v3.1", "v3.2" or "v4" for the hybrid-thinking templates, else None."""
    if not template or THINK_END not in template or "thinking" not in template:
        return None
    if DSML in template:
        return "v3.2" if "function_calls" in template else "v4"
    if CALLS_BEGIN in template and SEP in template and "```json" not in template:
        return "v3.1"
    return None


def template_thinks(template: str | None) -> bool:
    """Whether the template has a thinking mode at all (R1 always thinks, V3 and V2.5 never)."""
    return bool(template) and THINK_END in template


# -- the request

def thinking_variables(template: str | None, chat_template_kwargs: Any, reasoning_effort: Any) -> dict:
    """The template variables a request's thinking fields set (as llama-server sets them, with
    `deepseek-cpu serve`'s default: not thinking); a thought asked from a template without a
    thinking mode is a ToolRequestError naming the field."""
    if chat_template_kwargs is None:
        kw = {}
    elif isinstance(chat_template_kwargs, dict):
        kw = dict(chat_template_kwargs)
    else:
        raise ToolRequestError("chat_template_kwargs: expected an object")
    for key in ("thinking", "enable_thinking"):
        if key in kw and not isinstance(kw[key], bool):
            raise ToolRequestError(f"chat_template_kwargs.{key}: expected a boolean")
    if reasoning_effort is not None and not isinstance(reasoning_effort, str):
        raise ToolRequestError("reasoning_effort: expected a string")
    out = {"enable_thinking": False}
    asked = ("chat_template_kwargs.thinking" if kw.get("thinking") is True else
             "chat_template_kwargs.enable_thinking" if kw.get("enable_thinking") is True else
             "reasoning_effort" if reasoning_effort and reasoning_effort not in _EFFORTS_OFF else None)
    if asked and not template_thinks(template):
        raise ToolRequestError(f"{asked}: the model's chat template has no thinking mode")
    if reasoning_effort:
        out["enable_thinking"] = reasoning_effort not in _EFFORTS_OFF
        if reasoning_effort not in _EFFORTS_OFF:
            out["reasoning_effort"] = reasoning_effort
    out.update(kw)
    return out


def check_messages(messages: Any) -> None:
    """Roles the templates know, and every tool result answering a call of the assistant message
    before it (by id, where both carry ids): the server's 400s."""
    if not isinstance(messages, list):
        raise ToolRequestError("messages: expected a list")
    calls_at = None
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise ToolRequestError(f'messages[{i}].role: {role!r} is not one of "system", "developer", "user", '
                                   f'"assistant", "tool"')
        if role != "tool":
            calls_at = i if role == "assistant" and m.get("tool_calls") else None
            continue
        if calls_at is None:
            raise ToolRequestError(f"messages[{i}]: a tool result must follow an assistant message with tool_calls")
        ids = [c.get("id") for c in messages[calls_at]["tool_calls"] if isinstance(c, dict) and c.get("id")]
        got = m.get("tool_call_id")
        if got and ids and got not in ids:
            raise ToolRequestError(f'messages[{i}].tool_call_id: "{got}" is not the id of a call in '
                                   f"messages[{calls_at}].tool_calls")


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content


def template_messages(messages: list[dict], kind: str) -> list[dict]:
    """The messages as llama-server hands them to these templates: text contents, arguments as
    objects (V3.1's template writes `arguments | tojson`), V4's tool results in call order."""
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        m["content"] = _text(m.get("content"))
        if m.get("tool_calls"):
            calls = []
            for j, c in enumerate(m["tool_calls"]):
                fn = dict(c.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"] or "{}")
                    except ValueError:
                        raise ToolRequestError(f"messages[{i}].tool_calls[{j}].function.arguments: not valid JSON") from None
                calls.append({**c, "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    if kind == "v4":  # DeepSeek's encoder orders a run of results by the calls they answer
        order: dict = {}
        i = 0
        while i < len(out):
            if out[i]["role"] == "assistant" and out[i].get("tool_calls"):
                order = {c.get("id"): k for k, c in enumerate(out[i]["tool_calls"]) if c.get("id")}
            if out[i]["role"] not in ("user", "tool"):
                i += 1
                continue
            j = i
            while j < len(out) and out[j]["role"] in ("user", "tool"):
                j += 1
            pos = [k for k in range(i, j) if out[k]["role"] == "tool"]
            for k, m in zip(pos, sorted((out[k] for k in pos), key=lambda m: order.get(m.get("tool_call_id"), 0))):
                out[k] = m
            i = j
    return out


# -- grammars

def _may_be_string(s: Any) -> bool:
    """As llama.cpp's common_chat_schema::may_be_string: how DSML passes the value (raw or JSON)."""
    if not isinstance(s, dict):
        return False
    t = s.get("type")
    if t == "string" or (isinstance(t, list) and "string" in t):
        return True
    if "const" in s:
        return isinstance(s["const"], str)
    if "enum" in s:
        return any(isinstance(v, str) for v in s["enum"])
    for key in ("anyOf", "oneOf"):
        if key in s:
            return any(_may_be_string(c) for c in s[key])
    if "allOf" in s:
        kids = [c for c in s["allOf"] if c]
        return bool(kids) and all(_may_be_string(c) for c in kids)
    return False


def _until_rules(conv, delim: str, name: str) -> str:
    """A rule for any text that does not contain `delim` (whose first character occurs only there)."""
    first = delim[0]

    def cls(*chars):
        return "[^" + "".join("\\" + c if c in "\\]^-[" else c for c in chars) + "]"
    rules = [f"{cls(first)} {name}-0 | {_lit(first)} {name}-1 | "]
    for k in range(1, len(delim)):
        alt = [f"{_lit(delim[k])} {name}-{k + 1}"] if k + 1 < len(delim) else []
        alt += [f"{_lit(first)} {name}-1", f"{cls(delim[k], first)} {name}-0", ""]
        rules.append(" | ".join(alt))
    for k, r in enumerate(rules):
        conv._add_rule(f"{name}-{k}", r)
    return f"{name}-0"


def _converter():
    from llama_cpp.llama_grammar import SchemaConverter
    return SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


def _visit(conv, schema: Any, name: str) -> str:
    if not isinstance(schema, dict):
        raise ToolRequestError(f"{name}: expected a JSON schema object")
    return conv.visit(conv.resolve_refs(schema, "request"), name)


def _dsml_invoke(conv, i: int, fn: dict, kind: str) -> str:
    params = conv.resolve_refs(fn.get("parameters") or {"type": "object"}, "request")
    props, required = params.get("properties") or {}, set(params.get("required") or [])
    req, opt = [], []
    for k, (key, sub) in enumerate(props.items()):
        string = _may_be_string(sub)
        value = (_until_rules(conv, PARAM_END, f"tool{i}-p{k}-str") if string else conv.visit(sub, f"tool{i}-p{k}"))
        head = "<" + DSML + 'parameter name="' + key + '" string="' + ("true" if string else "false") + '">'
        rule = conv._add_rule(f"tool{i}-param{k}", f"{_lit(head)} {value} {_lit(PARAM_END + chr(10))}")
        (req if key in required else opt).append(rule)
    body = " ".join(req)
    if opt:
        body += f' ( {" | ".join(opt)} )*'
    if not req and kind == "v4":
        body += ' "\\n"?'  # V4 writes an empty line for a call without arguments
    head = "<" + DSML + 'invoke name="' + fn["name"] + '">\n'
    return f"{_lit(head)} {body} {_lit('</' + DSML + 'invoke>' + chr(10))}"


def calls_grammar(kind: str, tools: list[dict], parallel: bool, after_trigger: bool = False) -> str:
    """GBNF for the template's tool-call block (only what follows the block's opening marker when
    `after_trigger`, the lazy grammar's continuation)."""
    conv = _converter()
    alts = []
    for i, t in enumerate(tools):
        fn = t["function"]
        if kind == "v3.1":
            args = _visit(conv, fn.get("parameters") or {"type": "object"}, f"tool{i}-args")
            alts.append(f'{_lit(CALL_BEGIN + fn["name"] + SEP)} {args} {_lit(CALL_END)}')
        else:
            alts.append(_dsml_invoke(conv, i, fn, kind))
    conv._add_rule("call", " | ".join(f"( {a} )" for a in alts))
    calls = "call call*" if parallel else "call"
    if kind == "v3.1":
        open_, close = _lit(CALLS_BEGIN), _lit(CALLS_END)
    else:
        block = "function_calls" if kind == "v3.2" else "tool_calls"
        open_, close = f'"\\n\\n"? {_lit(f"<{DSML}{block}>")} "\\n"', _lit(f"</{DSML}{block}>")
        if after_trigger:
            open_ = '"\\n"'
    conv._add_rule("root", f"{'' if after_trigger and kind == 'v3.1' else open_} {calls} {close}".strip())
    return conv.format_grammar()


def schema_grammar(kind: str, schema: dict) -> str:
    conv = _converter()
    rule = _visit(conv, schema, "answer")
    conv._add_rule("root", rule if kind == "v3.1" else f'"```json" "\\n"? {rule} "\\n"? "```"')
    return conv.format_grammar()


def trigger(kind: str) -> str:
    return CALLS_BEGIN if kind == "v3.1" else f"<{DSML}{'function_calls' if kind == 'v3.2' else 'tool_calls'}>"


# -- parsing

_V31_CALL = re.compile(re.escape(CALL_BEGIN) + r"(.+?)" + re.escape(SEP) + r"(.*?)" + re.escape(CALL_END), re.DOTALL)
_V31_OPEN = re.compile(re.escape(CALL_BEGIN) + r"(.+?)" + re.escape(SEP) + r"(.*)$", re.DOTALL)
_INVOKE = re.compile("<" + re.escape(DSML) + r'invoke name="([^"]*)">\n?(.*?)</' + re.escape(DSML) + "invoke>", re.DOTALL)
_INVOKE_OPEN = re.compile("<" + re.escape(DSML) + r'invoke name="([^"]*)">\n?(.*)$', re.DOTALL)
_PARAM = re.compile("<" + re.escape(DSML) + r'parameter name="([^"]*)" string="(true|false)">(.*?)' + re.escape(PARAM_END),
                    re.DOTALL)


def _call(name: str, arguments: str) -> dict:
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name.strip(), "arguments": arguments}}


def _dsml_arguments(body: str, finished: bool) -> str:
    args = {}
    for m in _PARAM.finditer(body):
        if m.group(2) == "true":
            args[m.group(1)] = m.group(3)
        else:
            try:
                args[m.group(1)] = json.loads(m.group(3))
            except ValueError:
                args[m.group(1)] = m.group(3)
    text = json.dumps(args, ensure_ascii=False)
    return text if finished else text[:-1]  # a call cut off: arguments that do not parse


def parse_calls(kind: str, block: str, finished: bool) -> list[dict]:
    """The calls in a tool-call block (from its opening marker on)."""
    calls, end = [], 0
    if kind == "v3.1":
        for m in _V31_CALL.finditer(block):
            calls.append(_call(m.group(1), m.group(2).strip()))
            end = m.end()
        rest = _V31_OPEN.search(block, end)
        if rest is not None and not finished:
            calls.append(_call(rest.group(1), rest.group(2).strip()))
        return calls
    for m in _INVOKE.finditer(block):
        calls.append(_call(m.group(1), _dsml_arguments(m.group(2), True)))
        end = m.end()
    rest = _INVOKE_OPEN.search(block, end)
    if rest is not None and not finished:
        calls.append(_call(rest.group(1), _dsml_arguments(rest.group(2), False)))
    return calls


def _unfence(text: str) -> str:
    t = text.strip()
    if t.startswith("```json"):
        t = t[len("```json"):]
    if t.endswith("```"):
        t = t[:-3]
    return t.strip()


# -- generation

class _Phase:
    """One stretch of generation (a thought, an answer, a call block): text pieces as they come;
    afterwards .text, .finish ("stop" or "length"), .hit (the watched marker was written) and
    .tokens (tokens sampled)."""

    def __init__(self, llm, prompt: str, *, grammar: str | None = None, watch: str | None = None,
                 max_tokens: int | None = None, stop=None, sampling: dict):
        self.llm, self.prompt, self.grammar, self.watch = llm, prompt, grammar, watch
        self.max_tokens, self.stop, self.sampling = max_tokens, stop or [], sampling
        self.text, self.finish, self.hit, self.tokens = "", None, False, 0

    def run(self, stream: bool) -> Iterator[str]:
        from llama_cpp import LlamaGrammar, StoppingCriteriaList
        llm = self.llm
        ids = llm.tokenize(self.prompt.encode(), add_bos=False, special=True)
        n_prompt = len(ids)
        self.prompt_tokens = n_prompt
        watch = self.watch.encode() if self.watch else None

        def criteria(input_ids, logits):
            self.tokens += 1
            if watch is None or len(input_ids) <= n_prompt:
                return False
            tail = llm.detokenize(list(input_ids[max(n_prompt, len(input_ids) - len(watch) - 1):]), special=True)
            if watch in tail:
                self.hit = True
            return self.hit

        grammar = LlamaGrammar.from_string(self.grammar, verbose=False) if self.grammar else None
        if self.max_tokens is not None and self.max_tokens <= 0:
            self.finish = "length"
            return
        gen = llm.create_completion(ids, grammar=grammar, stream=stream, stop=self.stop,
                                    max_tokens=self.max_tokens, stopping_criteria=StoppingCriteriaList([criteria]),
                                    **self.sampling)
        if not stream:
            self.text, self.finish = gen["choices"][0]["text"], gen["choices"][0].get("finish_reason")
            self.tokens = gen["usage"]["completion_tokens"]
            yield self.text
            return
        for c in gen:
            piece = c["choices"][0]["text"]
            self.finish = c["choices"][0].get("finish_reason") or self.finish
            self.text += piece
            if piece:
                yield piece


def _held(text: str, marker: str, strip_ws: bool) -> int:
    """How much of `text` can be sent: all but a tail that may begin `marker` (and the whitespace
    before it, which is not content when a call follows)."""
    k = max((k for k in range(1, len(marker)) if text.endswith(marker[:k])), default=0)
    cut = len(text) - k
    while strip_ws and cut > 0 and text[cut - 1] in " \t\n":
        cut -= 1
    return cut


def chat_completion(llm, messages: list[dict], tools=None, tool_choice=None, response_format=None,
                    parallel_tool_calls: bool = False, stream: bool = False, chat_template_kwargs=None,
                    reasoning_effort=None, thinking_budget_tokens=None, reasoning_budget_tokens=None,
                    max_tokens=None, stop=None, logprobs=None, top_logprobs=None, **sampling):
    """create_chat_completion for the V3.1/V3.2/V4 templates (see the module docstring)."""
    template = llm.metadata.get("tokenizer.chat_template")
    kind = template_kind(template)
    check_messages(messages)
    offered, choice = check_tools(tools, tool_choice)
    schema = _response_schema(response_format)
    variables = thinking_variables(template, chat_template_kwargs, reasoning_effort)
    budget = thinking_budget_tokens if thinking_budget_tokens is not None else reasoning_budget_tokens
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool)):
        raise ToolRequestError("thinking_budget_tokens: expected an integer")
    if kind == "v4" and schema is not None:
        variables["response_format"] = schema
    if logprobs:
        raise ToolRequestError("logprobs: not supported for this chat template in process")
    sampling.pop("grammar", None)
    sampling.pop("functions", None)
    sampling.pop("function_call", None)
    for k, v in {"temperature": 0.2, "top_p": 0.95, "top_k": 40, "min_p": 0.05}.items():
        sampling.setdefault(k, v)  # create_chat_completion's defaults, not create_completion's
    stop = [stop] if isinstance(stop, str) else list(stop or [])

    bos, eos = llm._model.token_get_text(llm.token_bos()), llm._model.token_get_text(llm.token_eos())
    msgs = template_messages(messages, kind)
    try:
        prompt = render_prompt(template, msgs, offered if tools else None, bos, eos, **variables)
    except Exception as e:  # the template's raise_exception, a missing field
        raise ToolRequestError(f"messages: the chat template cannot render them: {e}") from None
    thinks = prompt.rfind(THINK_START) > prompt.rfind(THINK_END)
    calls_on = bool(offered) and choice != "none"
    forced = calls_on and choice == "required"
    plan = dict(kind=kind, offered=offered, parallel=bool(parallel_tool_calls), calls_on=calls_on, forced=forced,
                schema=schema, thinks=thinks, budget=budget, max_tokens=max_tokens, stop=stop, sampling=sampling)
    events = _generate(llm, prompt, plan, stream)
    return _stream(events) if stream else _whole(events, llm)


def _response_schema(response_format) -> dict | None:
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind in ("text", None):
        return None
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema", {"type": "object"})
    elif kind == "json_object":
        schema = response_format.get("schema", {"type": "object"})
    else:
        raise ToolRequestError(f'response_format type must be one of "text", "json_object" or "json_schema", got: {kind}')
    if not isinstance(schema, dict):
        raise ToolRequestError("response_format.json_schema.schema: expected a JSON object")
    schema = schema or {"type": "object"}
    try:
        schema_grammar("v3.1", schema)
    except Exception as e:
        raise ToolRequestError(f"response_format.json_schema.schema: {e}") from None
    return schema


def _generate(llm, prompt: str, plan: dict, stream: bool) -> Iterator[tuple]:
    """Events: ("reasoning", text), ("content", text), ("calls", [call...]), ("end", finish, usage)."""
    kind, used, prompt_tokens = plan["kind"], 0, None
    left = (lambda: None if plan["max_tokens"] is None else plan["max_tokens"] - used)

    def phase(text, **kw):
        return _Phase(llm, text, stop=kw.pop("stop", None), max_tokens=kw.pop("max_tokens", left()),
                      sampling=plan["sampling"], **kw)

    def usage():
        return {"prompt_tokens": prompt_tokens or 0, "completion_tokens": used,
                "total_tokens": (prompt_tokens or 0) + used}

    shaped = plan["forced"] or (plan["schema"] is not None and not plan["calls_on"])
    if plan["thinks"]:
        cap = left()
        if plan["budget"] is not None:
            cap = plan["budget"] if cap is None else min(cap, plan["budget"])
        p = phase(prompt, watch=THINK_END, max_tokens=cap)
        sent = 0
        for _ in p.run(stream):
            safe = _held(p.text, THINK_END, False)
            if stream and safe > sent and THINK_END not in p.text[:safe]:
                yield ("reasoning", p.text[sent:safe])
                sent = safe
        prompt_tokens, used = p.prompt_tokens, used + p.tokens
        thought = p.text.split(THINK_END, 1)[0]
        if len(thought) > sent or not stream:
            yield ("reasoning", thought[sent:] if stream else thought)
        over_budget = p.finish == "length" and (left() is None or left() > 0)
        if not (p.hit or over_budget or (shaped and p.finish == "stop")):
            yield ("end", p.finish, usage())  # cut by max_tokens, or the model ended inside its thought
            return
        prompt = prompt + thought + THINK_END
    if plan["forced"]:
        p = phase(prompt, grammar=calls_grammar(kind, plan["offered"], plan["parallel"]))
        for _ in p.run(stream):
            pass
        prompt_tokens, used = prompt_tokens or p.prompt_tokens, used + p.tokens
        yield ("calls", parse_calls(kind, p.text, p.finish != "length"))
        yield ("end", p.finish, usage())
        return
    if plan["schema"] is not None and not plan["calls_on"]:
        p = phase(prompt, grammar=schema_grammar(kind, plan["schema"]))
        for _ in p.run(stream):
            pass
        prompt_tokens, used = prompt_tokens or p.prompt_tokens, used + p.tokens
        yield ("content", p.text if kind == "v3.1" else _unfence(p.text))
        yield ("end", p.finish, usage())
        return
    marker = trigger(kind) if plan["calls_on"] else None
    p = phase(prompt, watch=marker, stop=plan["stop"])
    sent = 0
    for _ in p.run(stream):
        if not stream:
            continue
        safe = _held(p.text, marker, True) if marker else len(p.text)
        if marker and marker in p.text:
            safe = min(safe, p.text.index(marker))
        if safe > sent:
            yield ("content", p.text[sent:safe])
            sent = safe
    prompt_tokens, used = prompt_tokens or p.prompt_tokens, used + p.tokens
    if not (marker and p.hit and marker in p.text):
        if len(p.text) > sent:
            yield ("content", p.text[sent:])
        yield ("end", p.finish, usage())
        return
    before = p.text[:p.text.index(marker)]
    content = before.rstrip() if kind != "v3.1" else before
    if len(content) > sent:
        yield ("content", content[sent:])
    q = phase(prompt + before + marker, grammar=calls_grammar(kind, plan["offered"], plan["parallel"], after_trigger=True))
    for _ in q.run(stream):
        pass
    used += q.tokens
    yield ("calls", parse_calls(kind, marker + q.text, q.finish != "length"))
    yield ("end", q.finish, usage())


def _finish(finish: str | None, calls: list) -> str | None:
    return "tool_calls" if calls and finish == "stop" else finish


def _whole(events: Iterator[tuple], llm) -> dict:
    reasoning, content, calls, finish, usage = None, "", [], None, None
    for ev in events:
        if ev[0] == "reasoning":
            reasoning = (reasoning or "") + ev[1]
        elif ev[0] == "content":
            content += ev[1]
        elif ev[0] == "calls":
            calls = ev[1]
        else:
            finish, usage = ev[1], ev[2]
    message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()),
            "model": llm.model_path, "usage": usage,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _finish(finish, calls)}]}


def _stream(events: Iterator[tuple]) -> Iterator[dict]:
    cid, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())

    def chunk(delta, finish=None):
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": "",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    yield chunk({"role": "assistant"})
    calls = []
    for ev in events:
        if ev[0] == "reasoning" and ev[1]:
            yield chunk({"reasoning_content": ev[1]})
        elif ev[0] == "content" and ev[1]:
            yield chunk({"content": ev[1]})
        elif ev[0] == "calls":
            calls = ev[1]
            for i, call in enumerate(calls):
                yield chunk({"tool_calls": [{"index": i, **call}]})
        elif ev[0] == "end":
            yield chunk({}, _finish(ev[1], calls))
