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
    from conftest import REPO, llama_cpp_source_dir
    src = llama_cpp_source_dir()
    if src is not None and (src / "models" / "templates" / name).exists():
        return (src / "models" / "templates" / name).read_text()
    import sys
    import tomllib
    pin = tomllib.loads((REPO / "vendor" / "pin.toml").read_text())["sdist"]
    sys.path.insert(0, str(REPO / "vendor"))
    try:
        import prepare
        tarball = prepare.cache_dir() / pin["filename"]
    finally:
        sys.path.pop(0)
    if not tarball.exists():
        return None
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
    if served.tag == "v4" and thinking and case == "multi-turn":
        pytest.xfail("llama-server keeps earlier turns' thoughts by default (--reasoning-preserve), V4's template "
                     "drops them (drop_thinking): <think></think> instead of </think> before an earlier answer")
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
