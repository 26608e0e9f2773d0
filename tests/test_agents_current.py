"""Agents on the templates people use now: DeepSeek-V3.1, V3.2, V4 and V4-Flash-0731 (issue #48),
served by `deepseek-cpu serve` and driven by the real client packages.

Each model is the tiny DeepSeek-V3 fixture (v3_noaux) converted with one of those chat templates
(the ones llama.cpp ships in models/templates/, as a GGUF from such a checkpoint carries them).
Every template comes from the pinned llama.cpp source (vendor/pin.toml: the sdist's sha256 and
llama.cpp's commit) and must have the sha256 tests/fixtures/current_chat_templates.json records
for it (a changed template fails, it is not quietly tested). V4-Flash-0731's template is V4's
but for its "Reasoning Effort" preambles: V4's one for reasoning_effort "max" is its "high" one,
and its "max" has a stronger one.
All of them read `thinking` (else `enable_thinking`, else off): the prompt closes the think block
in non-thinking mode and leaves it open in thinking mode. Random weights cannot decide anything,
so every test forces a shape (a required or named call, a response_format schema) and checks what
comes back parses and validates (one call: with parallel calls allowed, a random model that has
written one may go on writing more until max_tokens); in thinking mode `thinking_budget_tokens` makes the server close
the thought, after which the grammar must hold. The prompts the server renders are compared with
transformers' own apply_chat_template (5.25, recorded by tests/fixtures/make_current_chat_fixtures.py
on a corpus of conversations x thinking modes x reasoning efforts) and with the template rendered
here by Python's jinja2 the way transformers renders it; V4's with DeepSeek's own V4 encoder
(deepseek-recipe, recorded in the same file), with the known difference spelled out.
Also: tool_choice "none"/"auto", reasoning_effort, bad input (400 naming the field), the turn after
a tool result, a LangGraph loop, LlamaIndex's OpenAILike, and the same in process
(deepseek_cpu.Llama, runtime/hybrid_chat.py).
"""
import hashlib
import json
import shutil
import tarfile
from typing import Annotated, Literal

import jsonschema
import pytest

from fixture_paths import fixture_dir
from served import Served, post

TEMPLATES = {"v3.1": "deepseek-ai-DeepSeek-V3.1.jinja", "v3.2": "deepseek-ai-DeepSeek-V3.2.jinja",
             "v4": "deepseek-ai-DeepSeek-V4.jinja", "v4-flash": "deepseek-ai-DeepSeek-V4-Flash-0731.jinja"}
# what runtime/hybrid_chat.template_kind calls each (V4-Flash-0731 has V4's markup)
KIND = {"v3.1": "v3.1", "v3.2": "v3.2", "v4": "v4", "v4-flash": "v4"}
# the generation prompt each template ends a user turn with, by mode
GEN_PROMPT = {"v3.1": {False: "<｜Assistant｜><think></think>", True: "<｜Assistant｜><think>"},
              "v3.2": {False: "<｜Assistant｜><think></think>", True: "<｜Assistant｜><think>"},
              "v4": {False: "<｜Assistant｜></think>", True: "<｜Assistant｜><think>"},
              "v4-flash": {False: "<｜Assistant｜></think>", True: "<｜Assistant｜><think>"}}
# transformers' renderings and each template's source and sha256 (make_current_chat_fixtures.py)
RECORDED = json.loads((fixture_dir("current_chat_templates.json")).read_text())
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


def _template_bytes(name: str) -> bytes | None:
    """models/templates/NAME of the pinned llama.cpp (the patched tree, else the cached sdist)."""
    from conftest import cached_sdist, llama_cpp_source_dir
    src = llama_cpp_source_dir()
    if src is not None and (src / "models" / "templates" / name).exists():
        return (src / "models" / "templates" / name).read_bytes()
    found = cached_sdist()
    if found is None:
        return None
    tarball, pin = found
    with tarfile.open(tarball) as tf:
        return tf.extractfile(f"{pin['llama_cpp_dir']}/models/templates/{name}").read()


def _template_text(tag: str) -> str | None:
    """The template under test for `tag`, checked against the source and sha256 recorded for it."""
    rec = RECORDED["templates"][tag]
    assert rec["name"] == TEMPLATES[tag]
    raw = _template_bytes(rec["name"])
    if raw is None:
        return None
    got = hashlib.sha256(raw).hexdigest()
    assert got == rec["sha256"], (f"{rec['name']}: sha256 {got}, but {rec['sha256']} is recorded (from "
                                  f"{rec['source']}): re-record with make_current_chat_fixtures.py")
    return raw.decode()


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
        text = _template_text(tag)
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


def test_recorded_templates_are_the_ones_under_test():
    """Every template under test has a recorded source and sha256, and transformers' renderings for
    each (conversation, mode) of the recorded corpus."""
    assert set(RECORDED["templates"]) == set(TEMPLATES) == set(RECORDED["texts"])
    for tag, rec in RECORDED["templates"].items():
        assert rec["name"] == TEMPLATES[tag] and len(rec["sha256"]) == 64 and "sha256" in rec["source"]
        assert set(RECORDED["texts"][tag]) == set(RECORDED["corpus"])
        assert all(set(v) == set(RECORDED["modes"]) for v in RECORDED["texts"][tag].values())
    # the preamble that tells V4-Flash-0731's template from V4's: reasoning_effort "high" in thinking mode
    flash, v4 = RECORDED["texts"]["v4-flash"]["user"], RECORDED["texts"]["v4"]["user"]
    assert flash["reasoning_effort high"] != v4["reasoning_effort high"]
    assert flash["thinking on"] == v4["thinking on"]


def _recorded_body(case, mode):
    c, m = RECORDED["corpus"][case], RECORDED["modes"][mode]
    body = {"messages": _wire(c["messages"]), **m["request"]}
    if c["tools"]:
        body["tools"] = c["tools"]
    return body


@pytest.mark.parametrize("mode", list(RECORDED["modes"]))
@pytest.mark.parametrize("case", list(RECORDED["corpus"]))
def test_prompt_equals_transformers_apply_chat_template(served, case, mode):
    """/apply-template gives transformers 5.25's own rendering, recorded, byte for byte."""
    got = _json(served, "/apply-template", _recorded_body(case, mode))["prompt"]
    want = RECORDED["texts"][served.tag][case][mode]
    assert BOS + got == want, (case, mode, got, want)


@pytest.mark.parametrize("mode", ["thinking off", "thinking on"])
def test_response_format_prompt_equals_transformers(served, mode):
    """V4's templates describe a response_format schema in the system prompt: the server passes the
    request's schema as the template's `response_format` (transformers' rendering, recorded)."""
    rf = RECORDED["response_format"]
    body = {**_recorded_body(rf["case"], mode),
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": rf["schema"]}}}
    got = BOS + _json(served, "/apply-template", body)["prompt"]
    want = rf["texts"].get(served.tag, {}).get(mode, RECORDED["texts"][served.tag][rf["case"]][mode])
    assert got == want, (mode, got, want)


# -- DeepSeek's own V4 encoder (deepseek-recipe's DeepseekV4Encoding, recorded)
#
# V4's templates and DeepSeek's encoder agree on everything in the corpus (turns, thoughts kept and
# dropped, calls, string and JSON arguments, tool results sorted into call order, the response_format
# section, the reasoning-effort preambles of V4-Flash-0731) but one thing: the encoder joins the tools
# and response-format sections onto the system prompt with "\n\n" even when that is empty, so a
# request with tools and no system message starts "<BOS>\n\n## Tools" there and "<BOS>## Tools" in
# the templates (which llama.cpp renders, and we with it). Two more differences are by vintage and
# default: V4.jinja's "max" preamble is the encoder's "high" one and it has no "high" (V4-Flash-0731's
# template matches the encoder), and the encoder's default effort in thinking mode is "high" (its
# preamble), where the templates' (and so ours, with thinking on and no reasoning_effort) is none.
RECIPE = RECORDED["deepseek_recipe"]
# our mode -> DeepSeek's encoder's mode, per V4 template
RECIPE_MODES = {"v4": {"thinking off": "thinking off", "thinking on": "thinking on, effort low"},
                "v4-flash": {"thinking off": "thinking off", "thinking on": "thinking on, effort low",
                             "reasoning_effort high": "reasoning_effort high",
                             "reasoning_effort max": "reasoning_effort max"}}
PREAMBLE = "Reasoning Effort: "


def _without_the_encoders_leading_blank_line(text: str) -> str:
    """The encoder's prompt with the known difference taken out: the "\n\n" before the first system
    section (## Tools, ## Response Format) when there is no system message."""
    head = BOS
    if text.startswith(BOS + PREAMBLE):
        head = text[:text.index("\n\n", len(BOS)) + 2]
    if text.startswith(head + "\n\n## "):
        return head + text[len(head) + 2:]
    return text


def _recipe_corpus():
    return {**RECORDED["corpus"], **RECIPE["extra_corpus"]}


def _has_first_section_without_system(messages, tools, response_format=False):
    return bool(tools or response_format) and not any(m["role"] == "system" for m in messages)


@pytest.mark.parametrize("tag", ["v4", "v4-flash"])
def test_v4_prompt_equals_deepseeks_own_encoder(tag):
    """Our renderer (runtime/hybrid_chat.py, which the tests above hold equal to the server's and
    to transformers') against DeepSeek's V4 encoder on the corpus, in the modes both spell the same
    way, with tool results out of call order too; the one known difference is checked to be there."""
    from deepseek_cpu.runtime import hybrid_chat, tool_calls
    template = _template_text(tag)
    if template is None:
        pytest.skip(f"not applicable: llama.cpp's models/templates/{TEMPLATES[tag]} is not available")
    kind = hybrid_chat.template_kind(template)
    assert kind == "v4"
    known = 0
    for case, c in _recipe_corpus().items():
        for mode, theirs in RECIPE_MODES[tag].items():
            req = RECORDED["modes"][mode]["request"]
            variables = hybrid_chat.thinking_variables(template, req.get("chat_template_kwargs"), req.get("reasoning_effort"))
            ours = tool_calls.render_prompt(template, hybrid_chat.template_messages(_wire(c["messages"]), kind),
                                            c["tools"], BOS, EOS, **variables)
            want = RECIPE["texts"][case][theirs]
            assert ours == _without_the_encoders_leading_blank_line(want), (case, mode, ours, want)
            if _has_first_section_without_system(c["messages"], c["tools"]):
                assert ours != want
                known += 1
            else:
                assert ours == want
    assert known  # the difference is real (if DeepSeek's encoder changes, this says so)
    rf = RECORDED["response_format"]
    c = RECORDED["corpus"][rf["case"]]
    for mode, theirs in [("thinking off", "thinking off"), ("thinking on", "thinking on, effort low")]:
        req = RECORDED["modes"][mode]["request"]
        variables = hybrid_chat.thinking_variables(template, req.get("chat_template_kwargs"), None)
        ours = tool_calls.render_prompt(template, hybrid_chat.template_messages(_wire(c["messages"]), kind), c["tools"],
                                        BOS, EOS, **variables, response_format=rf["schema"])
        assert ours == RECIPE["response_format"][theirs], mode
    # the differences by vintage and default, as recorded
    user = RECIPE["texts"]["user"]
    assert user["thinking on, default effort"] == user["reasoning_effort high"] != user["thinking on, effort low"]
    if tag == "v4":
        assert RECORDED["texts"]["v4"]["user"]["reasoning_effort max"] == user["reasoning_effort high"]


def test_v4_tool_results_out_of_call_order_as_deepseeks_encoder(served):
    """The server sorts a run of tool results into the order of the calls, as DeepSeek's V4 encoder
    does (the templates render them as given)."""
    if KIND[served.tag] != "v4":
        pytest.skip("not applicable: V3.1's and V3.2's templates render tool results as given")
    case = "results out of call order"
    c = RECIPE["extra_corpus"][case]
    for mode, theirs in RECIPE_MODES[served.tag].items():
        body = {"messages": _wire(c["messages"]), "tools": c["tools"], **RECORDED["modes"][mode]["request"]}
        got = BOS + _json(served, "/apply-template", body)["prompt"]
        assert got == _without_the_encoders_leading_blank_line(RECIPE["texts"][case][theirs]), (mode, got)


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


# The tools as LlamaIndex's FunctionTool describes them by default (the signature in the
# description): on the tiny model, V3.2's thought for this request becomes a run of single-byte
# tokens of a 2-byte character (b"\xd6", b"\xa4", b"\xd6", ...)
BYTE_SPLIT_THOUGHT = {
    "messages": [{"role": "user", "content": "2+3? Or switch the light."}],
    "tools": [{"type": "function", "function": {
        "name": "add", "description": "add(a: typing.Annotated[int, FieldInfo(annotation=NoneType, required=True, "
                                      "metadata=[Ge(ge=0), Le(le=9)])], b: typing.Annotated[int, FieldInfo("
                                      "annotation=NoneType, required=True, metadata=[Ge(ge=0), Le(le=9)])]) -> str\n"
                                      "Add two digits.",
        "parameters": {"properties": {"a": {"title": "A", "type": "integer"}, "b": {"title": "B", "type": "integer"}},
                       "required": ["a", "b"], "type": "object", "additionalProperties": False}, "strict": False}},
        {"type": "function", "function": {
            "name": "set_light", "description": "set_light(on: bool) -> str\nSwitch the light.",
            "parameters": {"properties": {"on": {"title": "On", "type": "boolean"}}, "required": ["on"],
                           "type": "object", "additionalProperties": False}, "strict": False}}],
    "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": MAX_TOKENS, "temperature": 0,
    "chat_template_kwargs": {"thinking": True}, "thinking_budget_tokens": BUDGET}


def test_thinking_budget_holds_when_the_thought_splits_characters(served):
    """thinking_budget_tokens closes the thought (and the required call follows) also when the
    thought's tokens are single bytes of multi-byte characters. The reasoning budget waits after
    the budget for a whole character before forcing </think>; upstream judged each token's piece
    alone, where a lone lead or continuation byte never is one, so on V3.2 the thought ran on to
    max_tokens and no call came (fixes/reasoning-budget-utf8-across-tokens.patch)."""
    ch = _json(served, "/v1/chat/completions", BYTE_SPLIT_THOUGHT)["choices"][0]
    assert ch["finish_reason"] == "tool_calls" and ch["message"]["reasoning_content"], ch["finish_reason"]
    for call in ch["message"]["tool_calls"]:
        assert call["function"]["name"] in TOOLS


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


# -- LlamaIndex's OpenAILike (llama-index-llms-openai-like, in the test extra)

def _openai_like(server, thinking, **kw):
    pytest.importorskip("llama_index.llms.openai_like")
    from llama_index.llms.openai_like import OpenAILike
    return OpenAILike(model="tiny", api_base=server.url + "/v1", api_key="none", is_chat_model=True,
                      is_function_calling_model=True, temperature=0, max_tokens=MAX_TOKENS, max_retries=0,
                      timeout=120, context_window=2048,
                      additional_kwargs={"extra_body": {**_thinking(thinking), **_budget(thinking)}}, **kw)


def _llama_index_tools(ran):
    from llama_index.core.tools import FunctionTool
    from pydantic import Field

    # LlamaIndex keeps a Field given as the default (minimum/maximum in the schema) and drops one
    # given in Annotated[...] (only its description is kept)
    def add(a: int = Field(ge=0, le=9), b: int = Field(ge=0, le=9)) -> str:
        """Add two digits."""
        ran.append(("add", a, b))
        return str(a + b)

    def set_light(on: bool) -> str:
        """Switch the light."""
        ran.append(("set_light", on))
        return f"light is {'on' if on else 'off'}"
    # short descriptions: LlamaIndex's default one repeats the signature, and the fixture's tokenizer
    # spells DeepSeek's markup byte by byte, so prompt and call must fit the server's 2048-token slot
    return [FunctionTool.from_defaults(fn=add, description="Add two digits."),
            FunctionTool.from_defaults(fn=set_light, description="Switch the light.")]


@pytest.mark.parametrize("thinking", [None, True])
def test_llama_index_predict_and_call(served, thinking):
    """predict_and_call with a call required: the call parses, validates against the tool's
    signature, and the tool runs once with those arguments."""
    ran = []
    tools = _llama_index_tools(ran)
    out = _openai_like(served, thinking).predict_and_call(tools, user_msg="2+3? Or switch the light.", tool_required=True,
                                                          error_on_tool_error=True)
    assert len(out.sources) == 1 and len(ran) == 1, (out, ran)
    assert all(v in range(10) for v in ran[0][1:] if not isinstance(v, bool)), ran
    src = out.sources[0]
    assert not src.is_error and src.tool_name == ran[0][0]
    assert out.response == src.content == (str(ran[0][1] + ran[0][2]) if ran[0][0] == "add" else
                                           f"light is {'on' if ran[0][1] else 'off'}")


@pytest.mark.parametrize("thinking", [None, True])
def test_llama_index_chat_with_tools_named_choice(served, thinking):
    tools = _llama_index_tools([])
    llm = _openai_like(served, thinking)
    resp = llm.chat_with_tools(tools, user_msg="Light?", tool_choice="set_light")
    calls = llm.get_tool_calls_from_response(resp, error_on_no_tool_call=True)
    assert len(calls) == 1 and calls[0].tool_name == "set_light" and calls[0].tool_id, calls
    assert isinstance(calls[0].tool_kwargs["on"], bool)
    assert bool(resp.message.additional_kwargs.get("reasoning_content") or
                getattr(resp.raw.choices[0].message, "reasoning_content", None)) is bool(thinking)
    assert "think>" not in (resp.message.content or "")


@pytest.mark.parametrize("thinking", [None, True])
@pytest.mark.parametrize("via", ["response_format", "tool call"])
def test_llama_index_structured_predict(served, via, thinking):
    """structured_predict both ways OpenAILike has: a response_format json_schema
    (should_use_structured_outputs) or a forced call of a tool whose parameters are the model's."""
    from llama_index.core.prompts import PromptTemplate
    from pydantic import BaseModel, Field

    class Answer(BaseModel):
        ok: bool
        n: Annotated[int, Field(ge=0, le=9)]

    llm = _openai_like(served, thinking, should_use_structured_outputs=via == "response_format")
    out = llm.structured_predict(Answer, PromptTemplate("Is {x} a digit?"), x="7")
    assert isinstance(out, Answer) and 0 <= out.n <= 9


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
    assert hybrid_chat.template_kind(llm.template) == KIND[llm.tag]
    for case, (messages, tools) in CORPUS.items():
        variables = hybrid_chat.thinking_variables(llm.template, _thinking(thinking).get("chat_template_kwargs"), None)
        got = tool_calls.render_prompt(llm.template, hybrid_chat.template_messages(_wire(messages), KIND[llm.tag]), tools,
                                       BOS, EOS, **variables)
        assert got == reference_render(llm.template, messages, tools,
                                       **({} if thinking is None else {"thinking": thinking})), case


def test_in_process_prompt_equals_transformers_apply_chat_template(llm):
    """The recorded corpus (transformers 5.25's renderings) in every mode, and V4's response_format."""
    from deepseek_cpu.runtime import hybrid_chat, tool_calls
    kind = KIND[llm.tag]
    rf = RECORDED["response_format"]
    for case, c in RECORDED["corpus"].items():
        for mode, m in RECORDED["modes"].items():
            req = m["request"]
            variables = hybrid_chat.thinking_variables(llm.template, req.get("chat_template_kwargs"),
                                                       req.get("reasoning_effort"))
            if case == rf["case"] and mode in rf["texts"].get(llm.tag, {}):
                want = rf["texts"][llm.tag][mode]
                got = tool_calls.render_prompt(llm.template, hybrid_chat.template_messages(_wire(c["messages"]), kind),
                                               c["tools"], BOS, EOS, **variables, response_format=rf["schema"])
                assert got == want, (case, mode, "response_format")
            got = tool_calls.render_prompt(llm.template, hybrid_chat.template_messages(_wire(c["messages"]), kind),
                                           c["tools"], BOS, EOS, **variables)
            assert got == RECORDED["texts"][llm.tag][case][mode], (case, mode)


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


def test_in_process_thinking_budget_holds_when_the_thought_splits_characters(llm):
    """The request that outlasts llama-server's reasoning budget on V3.2 (above): in process the
    budget counts tokens whatever their bytes, and the required call follows the thought."""
    body = json.loads(json.dumps(BYTE_SPLIT_THOUGHT))
    r = llm.create_chat_completion(body.pop("messages"), **body)
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls" and ch["message"]["reasoning_content"], ch
    assert ch["message"]["tool_calls"][0]["function"]["name"] in TOOLS


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
