"""Agents on the templates people use now: DeepSeek-V3.1, V3.2 and V4 (issue #48), served by
`deepseek-cpu serve` and driven by the real client packages.

Each model is the tiny DeepSeek-V3 fixture (v3_noaux) converted with one of those chat templates
(the ones llama.cpp ships in models/templates/, as a GGUF from such a checkpoint carries them).
All three read `thinking` (else `enable_thinking`, else off): the prompt closes the think block
in non-thinking mode and leaves it open in thinking mode. Random weights cannot decide anything,
so every test forces a shape (a required or named call, a response_format schema) and checks what
comes back parses and validates (one call: with parallel calls allowed, a random model that has
written one may go on writing more until max_tokens); in thinking mode `thinking_budget_tokens` makes the server close
the thought, after which the grammar must hold. The prompts the server renders are compared with
the template rendered by Python's jinja2 the way transformers' apply_chat_template renders it.
Also: tool_choice "none"/"auto", reasoning_effort, bad input (400 naming the field), the turn after
a tool result, a LangGraph loop, and the same in process (deepseek_cpu.Llama, runtime/hybrid_chat.py).
"""
import json
import shutil
import tarfile
from typing import Annotated, Literal

import jsonschema
import pytest

from fixture_paths import fixture_dir
from served import Served, post

TEMPLATES = {"v3.1": "deepseek-ai-DeepSeek-V3.1.jinja", "v3.2": "deepseek-ai-DeepSeek-V3.2.jinja",
             "v4": "deepseek-ai-DeepSeek-V4.jinja"}
# the generation prompt each template ends a user turn with, by mode
GEN_PROMPT = {"v3.1": {False: "<｜Assistant｜><think></think>", True: "<｜Assistant｜><think>"},
              "v3.2": {False: "<｜Assistant｜><think></think>", True: "<｜Assistant｜><think>"},
              "v4": {False: "<｜Assistant｜></think>", True: "<｜Assistant｜><think>"}}
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
MAX_TOKENS = 700   # the fixture's tokenizer spells DeepSeek's markers byte by byte
BUDGET = 12        # thinking_budget_tokens: the server closes the thought after this many tokens

# V3.2's and V4's markup passes string arguments as raw text up to </｜DSML｜parameter>, which a
# random model never writes: the tools here take bounded numbers and booleans (JSON values,
# constrained by their schemas in every template)
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two digits",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                                    "b": {"type": "integer", "minimum": 0, "maximum": 9}},
                   "required": ["a", "b"]}}}
LIGHT = {"type": "function", "function": {
    "name": "set_light", "description": "Switch the light",
    "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}
TOOLS = {t["function"]["name"]: t for t in (ADD, LIGHT)}
ANSWER_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                                  "n": {"type": "integer", "minimum": 0, "maximum": 9}},
                 "required": ["ok", "n"], "additionalProperties": False}


def _template_text(name: str) -> str | None:
    """models/templates/NAME of the pinned llama.cpp (the patched tree, else the cached sdist)."""
    from conftest import cached_sdist, llama_cpp_source_dir
    src = llama_cpp_source_dir()
    if src is not None and (src / "models" / "templates" / name).exists():
        return (src / "models" / "templates" / name).read_text()
    found = cached_sdist()
    if found is None:
        return None
    tarball, pin = found
    with tarfile.open(tarball) as tf:
        return tf.extractfile(f"{pin['llama_cpp_dir']}/models/templates/{name}").read().decode()


def reference_render(template: str, messages, tools=None, **kwargs) -> str:
    """The template rendered as transformers' apply_chat_template renders it (its jinja2
    environment and tojson), plus the `from_json` filter V3.2's and V4's templates use on string
    arguments (llama.cpp's jinja engine has it; the messages here carry arguments as objects)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.filters["from_json"] = json.loads
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, tools=tools, bos_token=BOS, eos_token=EOS,
                                            add_generation_prompt=True, **kwargs)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """tag -> (GGUF of the v3_noaux fixture carrying that template, the template)."""
    from deepseek_cpu.conversion.convert import convert
    out, root = {}, tmp_path_factory.mktemp("current-templates")
    for tag, name in TEMPLATES.items():
        text = _template_text(name)
        if text is None:
            pytest.skip(f"llama.cpp's models/templates/{name} is not available")
        d = root / tag
        shutil.copytree(fixture_dir("v3_noaux"), d)
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg["chat_template"] = text
        (d / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False))
        out[tag] = (convert(d, root / f"{tag}.gguf", outtype="f32", progress=False), text)
    return out


@pytest.fixture(scope="module", params=list(TEMPLATES))
def served(request, models, tmp_path_factory):
    tag = request.param
    gguf, template = models[tag]
    s = Served(gguf, tmp_path_factory.mktemp("agents-" + tag.replace(".", "")) / "server.log", parallel=2, ctx=2048)
    s.tag, s.template = tag, template
    yield s
    s.stop()


def _json(server, path, body):
    status, text = post(server.url + path, json.dumps(body).encode())
    assert status == 200, text
    return json.loads(text)


def _thinking(on):
    """The request fields that choose the mode: nothing (the model's default), or DeepSeek's
    own template variable."""
    return {} if on is None else {"chat_template_kwargs": {"thinking": on}}


def _budget(on):
    return {"thinking_budget_tokens": BUDGET} if on else {}


def _valid_call(name, arguments):
    assert name in TOOLS, name
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, TOOLS[name]["function"]["parameters"])
    return args


# -- the prompt: what the server renders equals the template rendered by jinja2 as transformers does

CALL_ARGS = {"a": 2, "b": 3}
CORPUS = {
    "user": ([{"role": "user", "content": "Hi!"}], None),
    "system+user": ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}], None),
    "tools": ([{"role": "user", "content": "2+3?"}], [ADD, LIGHT]),
    "multi-turn": ([{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."},
                    {"role": "user", "content": "Again?"}], None),
    "tool result": ([{"role": "user", "content": "2+3?"},
                     {"role": "assistant", "content": "", "tool_calls": [
                         {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": CALL_ARGS}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "5"}], [ADD]),
    "tool result, then user": ([{"role": "user", "content": "2+3?"},
                                {"role": "assistant", "content": "", "tool_calls": [
                                    {"id": "call_1", "type": "function", "function": {"name": "add",
                                                                                      "arguments": CALL_ARGS}}]},
                                {"role": "tool", "tool_call_id": "call_1", "content": "5"},
                                {"role": "assistant", "content": "It is 5."},
                                {"role": "user", "content": "And 4+4?"}], [ADD]),
}


def _wire(messages):
    """The messages as an OpenAI client sends them: arguments as a JSON string."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


@pytest.mark.parametrize("thinking", [None, False, True])
@pytest.mark.parametrize("case", list(CORPUS))
def test_prompt_equals_the_template_rendered_as_transformers_does(served, case, thinking):
    messages, tools = CORPUS[case]
    body = {"messages": _wire(messages), **_thinking(thinking)}
    if tools:
        body["tools"] = tools
    got = _json(served, "/apply-template", body)["prompt"]
    want = reference_render(served.template, messages, tools, **({} if thinking is None else {"thinking": thinking}))
    assert BOS + got == want, (case, got, want)


@pytest.mark.parametrize("kwargs, thinks", [({}, False), ({"thinking": False}, False), ({"thinking": True}, True),
                                            ({"enable_thinking": False}, False), ({"enable_thinking": True}, True)])
def test_thinking_is_chosen_per_request_with_the_models_default(served, kwargs, thinks):
    body = {"messages": [{"role": "user", "content": "Hi!"}]}
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    assert _json(served, "/apply-template", body)["prompt"].endswith(GEN_PROMPT[served.tag][thinks])


# -- the OpenAI client

@pytest.mark.parametrize("thinking", [None, True])
@pytest.mark.parametrize("choice", ["required", "add", "set_light"])
def test_forced_tool_call_parses_and_validates(served, choice, thinking):
    c = served.client()
    tool_choice = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "2+3?"}], tools=[ADD, LIGHT],
                                  tool_choice=tool_choice, parallel_tool_calls=False, max_tokens=MAX_TOKENS,
                                  temperature=0, extra_body={**_thinking(thinking), **_budget(thinking)})
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.tool_calls, ch
    for call in ch.message.tool_calls:
        assert call.type == "function" and call.id
        _valid_call(call.function.name, call.function.arguments)
        assert choice == "required" or call.function.name == choice
    reasoning = getattr(ch.message, "reasoning_content", None)
    assert bool(reasoning) is bool(thinking), reasoning
    assert "<think>" not in (ch.message.content or "") and "</think>" not in (ch.message.content or "")


@pytest.mark.parametrize("thinking", [None, False, True])
def test_response_format_json_schema(served, thinking):
    c = served.client()
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Answer."}],
                                  response_format={"type": "json_schema",
                                                   "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}},
                                  max_tokens=300, temperature=0, extra_body={**_thinking(thinking), **_budget(thinking)})
    ch = r.choices[0]
    assert ch.finish_reason == "stop", ch
    jsonschema.validate(json.loads(ch.message.content), ANSWER_SCHEMA)
    assert bool(getattr(ch.message, "reasoning_content", None)) is bool(thinking)


@pytest.mark.parametrize("thinking", [None, True])
def test_streamed_tool_call_equals_the_whole_reply(served, thinking):
    c = served.client()
    req = dict(model="tiny", messages=[{"role": "user", "content": "2+3?"}], tools=[ADD, LIGHT],
               tool_choice="required", parallel_tool_calls=False, max_tokens=MAX_TOKENS, temperature=0,
               extra_body={**_thinking(thinking), **_budget(thinking)})
    whole = c.chat.completions.create(**req).choices[0].message
    calls, finish, reasoning = {}, None, ""
    for chunk in c.chat.completions.create(**req, stream=True):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        reasoning += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
        for d in chunk.choices[0].delta.tool_calls or []:
            cur = calls.setdefault(d.index, {"name": "", "arguments": ""})
            if d.function is not None:
                cur["name"] += d.function.name or ""
                cur["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls"
    assert [(v["name"], json.loads(v["arguments"])) for _, v in sorted(calls.items())] == \
        [(w.function.name, json.loads(w.function.arguments)) for w in whole.tool_calls]
    assert reasoning == (getattr(whole, "reasoning_content", None) or "")


# -- langchain-openai's ChatOpenAI

def _chat_openai(server, thinking):
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI
    return ChatOpenAI(base_url=server.url + "/v1", api_key="none", model="tiny", temperature=0,
                      max_tokens=MAX_TOKENS, max_retries=0, extra_body={**_thinking(thinking), **_budget(thinking)})


@pytest.mark.parametrize("thinking", [None, True])
def test_langchain_bind_tools_named_choice(served, thinking):
    from langchain_core.tools import tool
    from pydantic import Field

    @tool
    def add(a: Annotated[int, Field(ge=0, le=9)], b: Annotated[int, Field(ge=0, le=9)]) -> int:
        """Add two digits."""
        return a + b

    ai = _chat_openai(served, thinking).bind_tools([add], tool_choice="add", parallel_tool_calls=False).invoke("What is 2+3?")
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "add" and ai.tool_calls[0]["id"], ai
    assert add.invoke(ai.tool_calls[0]["args"]) in range(19)


@pytest.mark.parametrize("thinking", [None, True])
def test_langchain_structured_output_json_schema(served, thinking):
    from pydantic import BaseModel

    class City(BaseModel):
        capital: bool
        zone: Literal["CET", "UTC"]

    out = _chat_openai(served, thinking).with_structured_output(City, method="json_schema").invoke("Paris?")
    assert isinstance(out, City)


# -- `deepseek-cpu serve`: the model's own default

def test_serve_keeps_the_templates_own_thinking_default(models, converted):
    """llama-server passes enable_thinking=true unless told otherwise; for templates whose own
    default is not to think, `serve` says `--reasoning off` (a request still turns thinking on),
    and never overrides the user's own flag."""
    import subprocess
    import sys
    from served import _env

    def args(model, *extra):
        r = subprocess.run([sys.executable, "-m", "deepseek_cpu", "serve", str(model), "--threads", "2", "--dry-run",
                            *extra], env=_env(), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    for tag in TEMPLATES:
        a = args(models[tag][0])
        assert a[a.index("--reasoning") + 1] == "off", tag
        a = args(models[tag][0], "--", "--reasoning", "on")
        assert a.count("--reasoning") == 1 and a[a.index("--reasoning") + 1] == "on"
    assert "--reasoning" not in args(converted("v3_noaux", "f32"))  # V3's template has no thinking mode


# -- tool_choice "none" and "auto", reasoning_effort (the server)

def test_tool_choice_none_answers_in_plain_text(served):
    ch = _json(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "2+3?"}], "tools": [ADD],
                                                "tool_choice": "none", "max_tokens": 16, "temperature": 0})["choices"][0]
    assert not ch["message"].get("tool_calls") and isinstance(ch["message"]["content"], str), ch


def test_tool_choice_auto_is_valid_either_way(served):
    ch = _json(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "2+3?"}], "tools": [ADD, LIGHT],
                                                "tool_choice": "auto", "max_tokens": 32, "temperature": 0})["choices"][0]
    for call in ch["message"].get("tool_calls") or []:
        _valid_call(call["function"]["name"], call["function"]["arguments"])
    assert isinstance(ch["message"].get("content") or "", str)


@pytest.mark.parametrize("effort, thinks", [("high", True), ("none", False), ("max", True)])
def test_reasoning_effort_chooses_thinking(served, effort, thinks):
    body = {"messages": [{"role": "user", "content": "Hi!"}], "reasoning_effort": effort}
    assert _json(served, "/apply-template", body)["prompt"].endswith(GEN_PROMPT[served.tag][thinks])
    ch = _json(served, "/v1/chat/completions", {**body, "max_tokens": 8, "temperature": 0})["choices"][0]
    assert bool(ch["message"].get("reasoning_content")) is thinks, ch


CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": json.dumps(CALL_ARGS)}}]}
BAD_INPUT = [
    ({"messages": [{"role": "user", "content": "2+3?"}, CALL, {"role": "tool", "tool_call_id": "call_9", "content": "5"}]},
     "messages[2].tool_call_id"),
    ({"messages": [{"role": "user", "content": "2+3?"}, {"role": "tool", "tool_call_id": "call_1", "content": "5"}]},
     "messages[1]: a tool result must follow"),
    ({"messages": [{"role": "tool", "tool_call_id": "call_1", "content": "5"}]}, "messages[0]: a tool result must follow"),
    ({"messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": "bogus"}}}]},
     "tools[0].function.parameters"),
]


@pytest.mark.parametrize("body, field", BAD_INPUT)
def test_bad_input_is_a_400_naming_the_field(served, body, field):
    import urllib.request
    status, text = post(served.url + "/v1/chat/completions", json.dumps({"max_tokens": 4, "tools": [ADD], **body}).encode())
    assert status == 400 and field in json.loads(text)["error"]["message"], text
    with urllib.request.urlopen(served.url + "/health", timeout=10) as r:
        assert r.status == 200


@pytest.mark.parametrize("thinking", [False, True])
def test_reply_after_tool_results(served, thinking):
    """The turn after a tool result (an agent loop's second request) answers: V3.2's prompt then
    ends without <｜Assistant｜>, which its reply parser required (a 500)."""
    msgs = [{"role": "user", "content": "2+3?"}, CALL, {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    ch = _json(served, "/v1/chat/completions", {"messages": msgs, "tools": [ADD], "max_tokens": 8, "temperature": 0,
                                                **_thinking(thinking)})["choices"][0]
    assert ch["finish_reason"] in ("stop", "length") and isinstance(ch["message"]["content"], str), ch


def test_thinking_asked_from_a_template_without_it_is_a_400(converted, tmp_path):
    """V3's template has no thinking mode: asking for a thought says so (it was ignored)."""
    s = Served(converted("v3_noaux", "f32"), tmp_path / "server.log", parallel=1, ctx=512)
    try:
        for extra, field in [({"chat_template_kwargs": {"thinking": True}}, "chat_template_kwargs.thinking"),
                             ({"chat_template_kwargs": {"enable_thinking": True}}, "chat_template_kwargs.enable_thinking"),
                             ({"reasoning_effort": "high"}, "reasoning_effort")]:
            status, text = post(s.url + "/v1/chat/completions", json.dumps(
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}).encode())
            assert status == 400 and field in json.loads(text)["error"]["message"], text
        r = _json(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                              "reasoning_effort": "none", "chat_template_kwargs": {"thinking": False}})
        assert isinstance(r["choices"][0]["message"]["content"], str)
    finally:
        s.stop()


# -- LangGraph: call -> tool result -> answer, through ChatOpenAI

def test_langgraph_tool_loop(served):
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    ran = []

    @tool
    def set_light(on: bool) -> str:
        """Switch the light."""
        ran.append(on)
        return f"light is {'on' if on else 'off'}"

    llm = _chat_openai(served, None)
    caller = llm.bind_tools([set_light], tool_choice="set_light", parallel_tool_calls=False)
    answerer = llm.bind(max_tokens=8)

    from test_agents import langgraph_tool_loop
    out = langgraph_tool_loop(caller, answerer, set_light, "Light?")
    call_msg, tool_msg, final = out[1], out[2], out[3]
    assert len(ran) == 1 and tool_msg.content == f"light is {'on' if ran[0] else 'off'}"
    assert tool_msg.tool_call_id == call_msg.tool_calls[0]["id"]
    assert isinstance(final, AIMessage) and not final.tool_calls and isinstance(final.content, str)


# -- in process: deepseek_cpu.Llama.create_chat_completion answers as the server does

# llama-cpp-python's schema converter, which builds the grammar in process, does not enforce
# numeric bounds: the in-process tools bound their digits with an enum
DIGIT = {"type": "integer", "enum": list(range(10))}
ADD_IN = {"type": "function", "function": {**ADD["function"], "parameters": {
    "type": "object", "properties": {"a": DIGIT, "b": DIGIT}, "required": ["a", "b"]}}}
TOOLS_IN = {"add": ADD_IN, "set_light": LIGHT}
IN_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": DIGIT}, "required": ["ok", "n"],
             "additionalProperties": False}


@pytest.fixture(scope="module", params=list(TEMPLATES))
def llm(request, models):
    from deepseek_cpu import Llama
    m = Llama(str(models[request.param][0]), n_ctx=2048, n_threads=2, verbose=False)
    m.tag, m.template = request.param, models[request.param][1]
    yield m
    m.close()


def _in_thinking(on):
    return {} if on is None else {"chat_template_kwargs": {"thinking": on}, **_budget(on)}


def _valid_in(call):
    assert call["id"].startswith("call_") and call["type"] == "function"
    fn = call["function"]
    jsonschema.validate(json.loads(fn["arguments"]), TOOLS_IN[fn["name"]]["function"]["parameters"])


@pytest.mark.parametrize("thinking", [None, False, True])
def test_in_process_prompt_equals_the_template_rendered_as_transformers_does(llm, thinking):
    from deepseek_cpu.runtime import hybrid_chat, tool_calls
    assert hybrid_chat.template_kind(llm.template) == llm.tag
    for case, (messages, tools) in CORPUS.items():
        variables = hybrid_chat.thinking_variables(llm.template, _thinking(thinking).get("chat_template_kwargs"), None)
        got = tool_calls.render_prompt(llm.template, hybrid_chat.template_messages(_wire(messages), llm.tag), tools,
                                       BOS, EOS, **variables)
        assert got == reference_render(llm.template, messages, tools,
                                       **({} if thinking is None else {"thinking": thinking})), case


@pytest.mark.parametrize("thinking", [None, True])
@pytest.mark.parametrize("choice", ["required", "add", "set_light"])
def test_in_process_forced_tool_call(llm, choice, thinking):
    tool_choice = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    r = llm.create_chat_completion([{"role": "user", "content": "2+3?"}], tools=[ADD_IN, LIGHT], tool_choice=tool_choice,
                                   max_tokens=MAX_TOKENS, temperature=0, **_in_thinking(thinking))
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls" and ch["message"]["tool_calls"], ch
    for call in ch["message"]["tool_calls"]:
        _valid_in(call)
        assert choice == "required" or call["function"]["name"] == choice
    assert bool(ch["message"].get("reasoning_content")) is bool(thinking)
    assert "think>" not in (ch["message"]["content"] or "")
    assert r["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("thinking", [None, True])
def test_in_process_streamed_tool_call_equals_the_whole_reply(llm, thinking):
    req = dict(messages=[{"role": "user", "content": "2+3?"}], tools=[ADD_IN, LIGHT], tool_choice="required",
               max_tokens=MAX_TOKENS, temperature=0, **_in_thinking(thinking))
    whole = llm.create_chat_completion(**req)["choices"][0]["message"]
    deltas = [c["choices"][0] for c in llm.create_chat_completion(**req, stream=True)]
    calls = [d["delta"]["tool_calls"][0] for d in deltas if d["delta"].get("tool_calls")]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in whole["tool_calls"]]
    assert "".join(d["delta"].get("reasoning_content") or "" for d in deltas) == (whole.get("reasoning_content") or "")
    assert deltas[-1]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("thinking", [None, True])
def test_in_process_response_format_json_schema(llm, thinking):
    r = llm.create_chat_completion([{"role": "user", "content": "Answer."}], max_tokens=300, temperature=0,
                                   response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": IN_SCHEMA}},
                                   **_in_thinking(thinking))
    ch = r["choices"][0]
    assert ch["finish_reason"] == "stop", ch
    jsonschema.validate(json.loads(ch["message"]["content"]), IN_SCHEMA)
    assert bool(ch["message"].get("reasoning_content")) is bool(thinking)


@pytest.mark.parametrize("stream", [False, True])
def test_in_process_thinking_and_tool_choice_none_and_auto(llm, stream):
    """Thinking per request (chat_template_kwargs, reasoning_effort): the thought in
    reasoning_content, never in content; "none" answers in text; "auto" is valid either way."""
    def ask(**kw):
        r = llm.create_chat_completion([{"role": "user", "content": "2+3?"}], tools=[ADD_IN, LIGHT], max_tokens=24,
                                       temperature=0, stream=stream, **kw)
        if not stream:
            return r["choices"][0]["message"]
        msg = {"content": "", "reasoning_content": "", "tool_calls": []}
        for c in r:
            d = c["choices"][0]["delta"]
            msg["content"] += d.get("content") or ""
            msg["reasoning_content"] += d.get("reasoning_content") or ""
            msg["tool_calls"] += d.get("tool_calls") or []
        return msg
    for kw, thinks in [({"tool_choice": "none"}, False), ({"tool_choice": "auto", "reasoning_effort": "none"}, False),
                       ({"tool_choice": "none", "reasoning_effort": "high", "thinking_budget_tokens": BUDGET}, True),
                       ({"tool_choice": "auto", "chat_template_kwargs": {"enable_thinking": True},
                         "thinking_budget_tokens": BUDGET}, True)]:
        msg = ask(**kw)
        assert bool(msg.get("reasoning_content")) is thinks, (kw, msg)
        assert "think>" not in (msg["content"] or "")
        if kw["tool_choice"] == "none":
            assert not msg.get("tool_calls") and isinstance(msg["content"], str)
        for call in msg.get("tool_calls") or []:
            assert call["function"]["name"] in TOOLS_IN


def test_in_process_tool_loop(llm):
    """call -> tool result (under the call's id) -> the next turn answers in text."""
    msgs = [{"role": "user", "content": "2+3?"}]
    call = llm.create_chat_completion(msgs, tools=[ADD_IN], max_tokens=MAX_TOKENS,
                                      tool_choice={"type": "function", "function": {"name": "add"}},
                                      temperature=0)["choices"][0]["message"]
    args = json.loads(call["tool_calls"][0]["function"]["arguments"])
    msgs += [call, {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": str(args["a"] + args["b"])}]
    final = llm.create_chat_completion(msgs, tools=[ADD_IN], max_tokens=8, temperature=0)["choices"][0]
    assert not final["message"].get("tool_calls") and isinstance(final["message"]["content"], str), final


@pytest.mark.parametrize("body, field", BAD_INPUT + [
    ({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"thinking": "yes"}},
     "chat_template_kwargs.thinking"),
    ({"messages": [{"role": "user", "content": "hi"}],
      "tools": [ADD, {"type": "function", "function": {"parameters": {"type": "object"}}}]}, "tools[1].function.name"),
])
def test_in_process_bad_input_names_the_field(llm, body, field):
    from deepseek_cpu.runtime.tool_calls import ToolRequestError
    body = {"tools": [ADD_IN], **body}
    with pytest.raises(ToolRequestError) as e:
        llm.create_chat_completion(body.pop("messages"), max_tokens=4, **body)
    assert field in str(e.value)


def test_in_process_thinking_asked_from_a_template_without_it(converted):
    from deepseek_cpu import Llama
    from deepseek_cpu.runtime.tool_calls import ToolRequestError
    m = Llama(str(converted("v3_noaux", "f32")), n_ctx=512, n_threads=2, verbose=False)
    try:
        for kw, field in [({"chat_template_kwargs": {"thinking": True}}, "chat_template_kwargs.thinking"),
                          ({"reasoning_effort": "high"}, "reasoning_effort")]:
            with pytest.raises(ToolRequestError, match=field):
                m.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4, **kw)
        r = m.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4, reasoning_effort="none")
        assert isinstance(r["choices"][0]["message"]["content"], str)
    finally:
        m.close()
