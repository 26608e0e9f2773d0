"""Agents and structured output through `deepseek-cpu serve`, driven by the real client packages.

The model is the tiny DeepSeek-V3 fixture (v3_noaux), which carries DeepSeek-V2.5's chat template
(the text DeepSeek-V3 shipped at release; V3's, V3-0324's, R1's and R1-0528's write tool calls with the
same markup). Random weights cannot decide to call a tool, so every test forces a shape (tool_choice
"required" or a named function, a response_format schema) and checks what comes back: it parses,
validates against its schema, its ids round-trip, and the prompt the server built equals
transformers' rendering (tests/fixtures/tool_chat_templates.json, from make_tool_chat_fixtures.py).
The older templates (V2-Chat, V2.5, V3, V3-0324, R1, R1-0528) come from recorded sources (PyPI wheels,
their sha256 and the templates' recorded in the same file), and their prompts, from the server and
in process, equal transformers 4.57's on a corpus of conversations.
"""
import hashlib
import json
import shutil
import urllib.request
from typing import Literal

import jsonschema
import pytest

from fixture_paths import fixture_dir
from served import Served, post

MODEL = "v3_noaux"
MAX_TOKENS = 600  # the fixture's tokenizer spells DeepSeek's tool markers byte by byte

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a zone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
                   "required": ["tz"]}}}
TOOLS = {t["function"]["name"]: t for t in (WEATHER, TIME)}
ANSWER_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                                  "n": {"type": "integer", "minimum": 0, "maximum": 9}},
                 "required": ["ok", "n"], "additionalProperties": False}
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
# make_tool_chat_fixtures.py: each template's source (a PyPI wheel and its sha256), sha256 and text, and
# transformers 4.57's renderings of a corpus of conversations with each
OLDER = json.loads(fixture_dir("tool_chat_templates.json").read_text())


@pytest.fixture(scope="module")
def server(converted, tmp_path_factory):
    s = Served(converted(MODEL, "f32"), tmp_path_factory.mktemp("agents") / "server.log", parallel=2, ctx=2048)
    yield s
    s.stop()


def _json(server, path, body):
    status, text = post(server.url + path, json.dumps(body).encode())
    assert status == 200, text
    return json.loads(text)


def _valid_call(name, arguments):
    """A tool call names one of the tools and its arguments validate against that tool's schema."""
    assert name in TOOLS, name
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, TOOLS[name]["function"]["parameters"])
    return args


# -- the prompt: what the engine saw equals transformers' apply_chat_template(..., tools=...)

def test_prompt_with_tools_equals_transformers(server):
    oracle = OLDER
    assert oracle["cases"]
    with urllib.request.urlopen(server.url + "/props", timeout=30) as r:
        served = json.loads(r.read())["chat_template"]
    assert hashlib.sha256(served.encode()).hexdigest() == OLDER["templates"][OLDER["fixture_template"]]["sha256"]
    for case in oracle["cases"]:
        got = _json(server, "/apply-template", {"messages": case["messages"], "tools": case["tools"]})["prompt"]
        bos = "<｜begin▁of▁sentence｜>"  # the server adds BOS when it tokenizes, not in the text
        assert bos + got == case["text"], (case["messages"], got)
        ids = _json(server, "/tokenize", {"content": got, "add_special": True})["tokens"]
        assert ids == case["ids"]


# -- the OpenAI client against the server

def test_required_tool_call_parses_and_validates(server):
    c = server.client()
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                  tools=[WEATHER, TIME], tool_choice="required", max_tokens=MAX_TOKENS, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.tool_calls
    for call in ch.message.tool_calls:
        assert call.type == "function" and call.id
        _valid_call(call.function.name, call.function.arguments)


@pytest.mark.parametrize("name", ["get_weather", "get_time"])
def test_named_tool_choice_calls_that_function(server, name):
    c = server.client()
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], tools=[WEATHER, TIME],
                                  tool_choice={"type": "function", "function": {"name": name}},
                                  max_tokens=MAX_TOKENS, temperature=0)
    calls = r.choices[0].message.tool_calls
    assert calls and {x.function.name for x in calls} == {name}
    _valid_call(name, calls[0].function.arguments)


def test_streamed_tool_call_equals_the_whole_reply(server):
    c = server.client()
    req = dict(model="tiny", messages=[{"role": "user", "content": "Time?"}], tools=[WEATHER, TIME],
               tool_choice="required", max_tokens=MAX_TOKENS, temperature=0)
    whole = c.chat.completions.create(**req).choices[0].message.tool_calls
    calls, finish = {}, None
    for chunk in c.chat.completions.create(**req, stream=True):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for d in chunk.choices[0].delta.tool_calls or []:
            cur = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            cur["id"] = d.id or cur["id"]
            if d.function is not None:
                cur["name"] += d.function.name or ""
                cur["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls"
    assert [(v["name"], json.loads(v["arguments"])) for _, v in sorted(calls.items())] == \
        [(w.function.name, json.loads(w.function.arguments)) for w in whole]
    assert all(v["id"] for v in calls.values())


def test_response_format_json_schema(server):
    c = server.client()
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Answer."}],
                                  response_format={"type": "json_schema",
                                                   "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}},
                                  max_tokens=200, temperature=0)
    jsonschema.validate(json.loads(r.choices[0].message.content), ANSWER_SCHEMA)


def test_tool_results_fed_back_reach_the_prompt_in_deepseek_form(server):
    """A second request carrying the call and its result: the server renders the result in the
    template's <｜tool▁outputs▁begin｜> form and answers with text."""
    c = server.client()
    first = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Weather?"}],
                                      tools=[WEATHER], tool_choice="required", max_tokens=MAX_TOKENS, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    msgs = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    prompt = _json(server, "/apply-template", {"messages": msgs, "tools": [WEATHER]})["prompt"]
    assert f"<｜tool▁sep｜>{call.function.name}\n```json\n{call.function.arguments}\n```" in prompt
    assert prompt.endswith("<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜><｜tool▁outputs▁end｜>")
    final = c.chat.completions.create(model="tiny", messages=msgs, tools=[WEATHER], max_tokens=8, temperature=0)
    assert final.choices[0].finish_reason in ("stop", "length")
    assert isinstance(final.choices[0].message.content, str)


# -- LangChain: langchain-openai's ChatOpenAI and langchain-llama-cpp's ChatLlama

def _chat_openai(server, **kw):
    from langchain_openai import ChatOpenAI
    return ChatOpenAI(base_url=server.url + "/v1", api_key="none", model="tiny", temperature=0,
                      max_tokens=MAX_TOKENS, max_retries=0, **kw)


def test_langchain_openai_bind_tools(server):
    from langchain_core.tools import tool

    @tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """Current weather in a city."""
        return "sunny"

    ai = _chat_openai(server).bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Paris?")
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "get_weather" and ai.tool_calls[0]["id"]
    assert ai.tool_calls[0]["args"]["city"] in ("Paris", "Rome")
    # streaming: the chunks add up to the same call
    agg = None
    for chunk in _chat_openai(server).bind_tools([get_weather], tool_choice="get_weather").stream("Weather in Paris?"):
        agg = chunk if agg is None else agg + chunk
    assert [(t["name"], t["args"]) for t in agg.tool_calls] == [(t["name"], t["args"]) for t in ai.tool_calls]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_openai_structured_output(server, method):
    from pydantic import BaseModel

    class Answer(BaseModel):
        ok: bool
        unit: Literal["c", "f"]

    out = _chat_openai(server).with_structured_output(Answer, method=method).invoke("Answer.")
    assert isinstance(out, Answer)


def test_langchain_llama_cpp_chat_llama(server):
    from langchain_llama_cpp import ChatLlama

    llm = ChatLlama(model="tiny", base_url=server.url, temperature=0, max_tokens=MAX_TOKENS, max_retries=0)
    ai = llm.bind_tools([WEATHER, TIME], tool_choice="required").invoke("Weather?")
    assert ai.tool_calls
    for t in ai.tool_calls:
        _valid_call(t["name"], t["args"])
    out = llm.with_structured_output({"title": "Answer", **ANSWER_SCHEMA}, method="json_schema").invoke("Answer.")
    jsonschema.validate(out, ANSWER_SCHEMA)


def langgraph_tool_loop(caller, answerer, the_tool, question: str) -> list:
    """The messages of one LangGraph loop: `caller` asks for a call, LangGraph's ToolNode runs
    `the_tool`, `answerer` answers from its result (test_agents_current.py runs it too)."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    def agent(state: MessagesState):
        last = state["messages"][-1]
        return {"messages": [(answerer if isinstance(last, ToolMessage) else caller).invoke(state["messages"])]}

    def route(state: MessagesState):
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([the_tool]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route, ["tools", END])
    g.add_edge("tools", "agent")
    return g.compile().invoke({"messages": [HumanMessage(question)]}, {"recursion_limit": 6})["messages"]


def test_langgraph_tool_loop(server):
    """call -> tool result -> final answer, with LangGraph's ToolNode running the tool."""
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    ran = []

    @tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """Current weather in a city."""
        ran.append(city)
        return f"sunny in {city}"

    sent = []  # request bodies, to check what the second turn put in front of the model

    def record(request):
        if request.url.path.endswith("/chat/completions"):
            sent.append(json.loads(request.content))

    import httpx
    llm = _chat_openai(server, http_client=httpx.Client(event_hooks={"request": [record]}))
    caller = llm.bind_tools([get_weather], tool_choice="get_weather")
    answerer = llm.bind(max_tokens=8)

    out = langgraph_tool_loop(caller, answerer, get_weather, "Weather?")

    call_msg, tool_msg, final = out[1], out[2], out[3]
    assert len(ran) == 1 and tool_msg.content == f"sunny in {ran[0]}"
    assert tool_msg.tool_call_id == call_msg.tool_calls[0]["id"]
    assert isinstance(final, AIMessage) and not final.tool_calls and isinstance(final.content, str)
    # the second request carried the call and its result with the same id, and the server
    # rendered them in DeepSeek's form
    second = sent[-1]["messages"]
    assert second[1]["tool_calls"][0]["id"] == second[2]["tool_call_id"] == call_msg.tool_calls[0]["id"]
    prompt = _json(server, "/apply-template", {"messages": second})["prompt"]
    assert f"<｜tool▁output▁begin｜>sunny in {ran[0]}<｜tool▁output▁end｜>" in prompt


# -- LlamaIndex: OpenAILike

def test_llama_index_openai_like(server):
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai_like import OpenAILike

    def get_time(tz: Literal["UTC", "CET"]) -> str:
        """Current time in a zone."""
        return "12:00"

    llm = OpenAILike(model="tiny", api_base=server.url + "/v1", api_key="none", is_chat_model=True,
                     is_function_calling_model=True, temperature=0, max_tokens=MAX_TOKENS, max_retries=0,
                     context_window=2048)
    resp = llm.chat_with_tools([FunctionTool.from_defaults(fn=get_time)], user_msg="Time?", tool_required=True)
    calls = llm.get_tool_calls_from_response(resp, error_on_no_tool_call=True)
    assert calls[0].tool_name == "get_time" and calls[0].tool_kwargs["tz"] in ("UTC", "CET")


# -- bad input

@pytest.mark.parametrize("body, field", [
    ({"tools": [{"type": "function", "function": {"parameters": {"type": "object"}}}], "tool_choice": "required"},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": "bogus"}}}]},
     "tools[0].function.parameters"),
    ({"tools": ["not a tool"]}, "tools[0]"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "nonsense"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format"),
])
def test_malformed_tools_and_schemas_are_400_naming_the_field(server, body, field):
    status, text = post(server.url + "/v1/chat/completions",
                        json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body}).encode())
    assert status == 400, text
    assert field in json.loads(text)["error"]["message"]
    with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
        assert r.status == 200


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_cut_by_max_tokens_ends_cleanly(server, stream):
    """A call cut off mid-arguments: the reply ends with finish_reason "length" (a partial call's
    arguments do not parse, which clients report as an invalid call), and the server keeps serving."""
    c = server.client()
    req = dict(model="tiny", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER],
               tool_choice="required", max_tokens=60, temperature=0)
    if stream:
        finish = None
        for chunk in c.chat.completions.create(**req, stream=True):
            if chunk.choices:
                finish = chunk.choices[0].finish_reason or finish
        assert finish == "length"
    else:
        ch = c.chat.completions.create(**req).choices[0]
        assert ch.finish_reason == "length"
        for call in ch.message.tool_calls or []:
            with pytest.raises(json.JSONDecodeError):
                json.loads(call.function.arguments)
    test_required_tool_call_parses_and_validates(server)


# -- in process: deepseek_cpu.Llama.create_chat_completion answers as the server does

@pytest.fixture(scope="module")
def llm(converted):
    from deepseek_cpu import Llama
    return Llama(str(converted(MODEL, "f32")), n_ctx=2048, n_threads=2, verbose=False)


def test_in_process_prompt_equals_transformers(llm):
    from deepseek_cpu.runtime import tool_calls
    oracle = OLDER
    template = llm.metadata["tokenizer.chat_template"]
    assert hashlib.sha256(template.encode()).hexdigest() == OLDER["templates"][OLDER["fixture_template"]]["sha256"]
    assert tool_calls.is_deepseek_tool_template(template)
    for case in oracle["cases"]:
        text = tool_calls.render_prompt(template, case["messages"], case["tools"], "<｜begin▁of▁sentence｜>",
                                        "<｜end▁of▁sentence｜>")
        assert text == case["text"]
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == case["ids"]


# -- DeepSeek's older templates (V2-Chat, V2.5, V3, V3-0324, R1, R1-0528), each from a recorded source



def _older_template(tag: str) -> str:
    """Template `tag`, refused unless its text has the sha256 recorded with its source."""
    rec = OLDER["templates"][tag]
    got = hashlib.sha256(rec["text"].encode()).hexdigest()
    assert got == rec["sha256"], (f"{tag}: sha256 {got}, but {rec['sha256']} is recorded (from {rec['source']}): "
                                  "re-record with make_tool_chat_fixtures.py")
    return rec["text"]


# Content "" beside tool calls (LangChain's, and transformers 5's form) is read as None by the server
# (patches/files/common/parsers/dsc-deepseek-tool-calls.cpp) and by runtime/tool_calls.render_prompt, on
# purpose: V2.5's and V3's templates draw an assistant's calls only for a None content, and for "" they
# drop them from the prompt (transformers' rendering of the "" case, which test_older_templates_are_the_
# recorded_ones checks). So the prompt expected for it is transformers' for the same turn with None.
EMPTY_AS_NONE = {'tool result, content ""': "tool result"}


def _older_cases(tag: str):
    """(case, messages, tools, the text expected: transformers') for each conversation the template renders."""
    for case, c in OLDER["corpus"].items():
        text = OLDER["texts"][tag][EMPTY_AS_NONE.get(case, case) if tag != "v2-chat" else case]
        if text is not None:  # None: V2-Chat's template has no tool messages (transformers raises)
            yield case, c["messages"], c["tools"], text


def test_older_templates_are_the_recorded_ones():
    """Each template has its recorded sha256; v3_noaux (the `server` above, and `llm`) carries
    V2.5's; the corpus tells the templates apart (no two render it alike); R1's prompts open a
    thought that V3-0324's, the same template but for that, do not; V2.5's and V3's drop the calls
    of a "" content (hence EMPTY_AS_NONE); R1's cuts earlier thoughts."""
    tags = list(OLDER["templates"])
    assert tags == ["v2-chat", "v2.5", "v3", "v3-0324", "r1", "r1-0528"]
    for tag in tags:
        _older_template(tag)
        assert OLDER["templates"][tag]["source"]["wheel_sha256"]
    own = json.loads((fixture_dir(MODEL) / "tokenizer_config.json").read_text())["chat_template"]
    assert hashlib.sha256(own.encode()).hexdigest() == OLDER["templates"][OLDER["fixture_template"]]["sha256"]
    assert len({json.dumps(OLDER["texts"][t], sort_keys=True) for t in tags}) == len(tags)
    r1, v3_0324 = OLDER["texts"]["r1"], OLDER["texts"]["v3-0324"]
    assert r1["user"] == v3_0324["user"] + "<think>\n" and r1["user"].endswith("<｜Assistant｜><think>\n")
    # transformers drops the calls of a "" content from V2.5's and V3's prompts (not from the others')
    for tag in tags[1:]:
        empty, none = OLDER["texts"][tag]['tool result, content ""'], OLDER["texts"][tag]["tool result"]
        assert (empty == none) == (tag not in ("v2.5", "v3")), tag
        assert ("<｜tool▁calls▁begin｜>" in empty) == (tag not in ("v2.5", "v3")), tag
    # R1's own template cuts an earlier reply at </think> and never reads a reasoning_content field
    assert "A greeting." not in r1["earlier thought in content"]
    assert "<｜Assistant｜>\n\nHello.<｜end▁of▁sentence｜>" in r1["earlier thought in content"]
    assert "A greeting." not in r1["earlier thought as reasoning_content"]


@pytest.fixture(scope="module", params=["v2-chat", "v2.5", "v3", "v3-0324", "r1", "r1-0528"])
def older_server(request, tmp_path_factory):
    """`deepseek-cpu serve` on the v3_noaux fixture converted with template `request.param`."""
    from deepseek_cpu.conversion.convert import convert
    tag = request.param
    template = _older_template(tag)
    root = tmp_path_factory.mktemp("older-" + tag.replace(".", ""))
    shutil.copytree(fixture_dir(MODEL), root / "hf")
    cfg = json.loads((root / "hf" / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (root / "hf" / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False))
    gguf = convert(root / "hf", root / f"{tag}.gguf", outtype="f32", progress=False)
    s = Served(gguf, root / "server.log", parallel=1, ctx=1024)
    s.tag, s.template = tag, template
    yield s
    s.stop()


def test_older_template_prompts_equal_transformers(older_server):
    """What llama-server renders (/apply-template) equals transformers' apply_chat_template, byte
    for byte, for every conversation of the corpus (system, user, multi-turn, tool calls and
    results, text before a call, earlier thoughts)."""
    with urllib.request.urlopen(older_server.url + "/props", timeout=30) as r:
        served = json.loads(r.read())["chat_template"]
    assert hashlib.sha256(served.encode()).hexdigest() == OLDER["templates"][older_server.tag]["sha256"]
    # R1-0528's template reads every assistant message's content as a string ('</think>' in content):
    # beside a tool call it gets "" where V2.5's and V3's get the null they draw calls for (the server's
    # handler, patches/files/common/parsers/dsc-deepseek-tool-calls.cpp, falls back to the messages as
    # they came when the template raises on a null; it was a 500 before)
    for case, messages, tools, text in _older_cases(older_server.tag):
        got = _json(older_server, "/apply-template", {"messages": messages, **({"tools": tools} if tools else {})})
        # the server adds BOS when it tokenizes, not in the text
        assert BOS + got["prompt"] == text, (older_server.tag, case)


@pytest.mark.parametrize("tag", ["v2-chat", "v2.5", "v3", "v3-0324", "r1", "r1-0528"])
def test_in_process_older_template_prompts_equal_transformers(tag):
    """deepseek_cpu.Llama's renderers give transformers' prompts: runtime/tool_calls.render_prompt
    (requests with tools or a JSON schema, on templates with DeepSeek's tool markup) for every
    conversation, llama-cpp-python's Jinja2ChatFormatter (every other request) for those without tools."""
    from deepseek_cpu.runtime import tool_calls
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    template = _older_template(tag)
    assert tool_calls.is_deepseek_tool_template(template) == (tag != "v2-chat")
    plain = Jinja2ChatFormatter(template, eos_token=EOS, bos_token=BOS)
    for case, messages, tools, text in _older_cases(tag):
        if tool_calls.is_deepseek_tool_template(template):
            assert tool_calls.render_prompt(template, messages, tools, BOS, EOS) == text, (tag, case)
        if not tools:
            assert plain(messages=messages).prompt == text, (tag, case)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}},
                                         {"type": "function", "function": {"name": "get_weather"}}])
def test_in_process_tool_calls_equal_the_servers(llm, server, tool_choice):
    req = dict(messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER, TIME],
               tool_choice=tool_choice, max_tokens=MAX_TOKENS, temperature=0)
    whole = llm.create_chat_completion(**req)
    assert whole["usage"]["completion_tokens"] > 0
    here = whole["choices"][0]
    there = _json(server, "/v1/chat/completions", {"model": "tiny", **req})["choices"][0]
    assert here["finish_reason"] == there["finish_reason"] == "tool_calls"

    def calls(msg):
        return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]]
    assert calls(here["message"]) == calls(there["message"])
    for c in here["message"]["tool_calls"]:
        assert c["id"].startswith("call_") and c["type"] == "function"
        _valid_call(c["function"]["name"], c["function"]["arguments"])
    # streamed: the same call, as one delta
    deltas = [ch["choices"][0] for ch in llm.create_chat_completion(**req, stream=True)]
    streamed = [d["delta"]["tool_calls"][0] for d in deltas if d["delta"].get("tool_calls")]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in streamed] == calls(here["message"])
    assert deltas[-1]["finish_reason"] == "tool_calls"


def test_in_process_response_format(llm):
    # llama-cpp-python's schema converter, which builds the grammar here, does not enforce
    # numeric bounds (the server's does): the schema checked here has none
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "unit": {"enum": ["c", "f"]}},
              "required": ["ok", "unit"]}
    r = llm.create_chat_completion([{"role": "user", "content": "Answer."}], max_tokens=200, temperature=0,
                                   response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)


@pytest.mark.parametrize("kw, field", [
    ({"tools": [{"type": "function", "function": {"parameters": {"type": "object"}}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": "not a schema"}}},
     "response_format.json_schema.schema"),
])
def test_in_process_bad_requests_name_the_field(llm, kw, field):
    from deepseek_cpu.runtime.tool_calls import ToolRequestError
    with pytest.raises(ToolRequestError, match=field.replace("[", r"\[").replace("]", r"\]")):
        llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4, **kw)


def test_template_without_tool_calls_refuses_a_required_call(converted, tmp_path):
    """DeepSeek-V2-Chat's template (v2_greedy) defines no tool calls: a required or named call is a
    400 that says so (it used to come back as plain text); "auto" answers with text."""
    s = Served(converted("v2_greedy", "f32"), tmp_path / "server.log", parallel=1, ctx=512)
    try:
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            status, text = post(s.url + "/v1/chat/completions", json.dumps(
                {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER], "tool_choice": choice,
                 "max_tokens": 4}).encode())
            assert status == 400 and "defines no tool calls" in json.loads(text)["error"]["message"], text
        r = _json(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER],
                                              "max_tokens": 4})
        assert isinstance(r["choices"][0]["message"]["content"], str)
    finally:
        s.stop()
