"""Where users already are: LangChain, LlamaIndex, chat templates, long conversations, logging.

Every integration is the real package (the `test` extra installs them), run on tiny
DeepSeek GGUFs converted from the fixtures. The server (`deepseek-cpu serve`) is tested in
tests/test_serve.py.
"""
import json
import os
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES, fixture_dir, run_python

# A source checkout on PYTHONPATH has no lib/: use the installed engine, like engine.lib_dir() says.
_INSTALLED_LIB = Path(sysconfig.get_paths()["purelib"]) / "deepseek_cpu" / "lib"
if "LLAMA_CPP_LIB_PATH" not in os.environ and (_INSTALLED_LIB / "libllama.so").exists():
    os.environ["LLAMA_CPP_LIB_PATH"] = str(_INSTALLED_LIB)

TOL = 1e-4
YARN = ["v2_group", "v2_lite"]  # both declare rope_scaling {"type": "yarn"}


def rel_errors(got, ref):
    return np.abs(got - ref).max(axis=1) / np.abs(ref).max(axis=1)


def _logits(llm, tokens):
    llm.reset()
    llm.eval([int(t) for t in tokens])
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)


# --------------------------------------------------------------------------------------------
# YaRN: wrappers pass rope_freq_scale=1.0, rope_freq_base=10000 (fixes/yarn-keep-model-rope-for-wrapper-defaults.patch)
# --------------------------------------------------------------------------------------------

WRAPPER_ROPE = {"rope_freq_scale": 1.0, "rope_freq_base": 10000.0}


@pytest.mark.parametrize("name", YARN)
def test_wrapper_rope_defaults_keep_the_models_yarn(converted, name):
    """llama_cpp.Llama with the values LangChain always passes gives transformers' logits."""
    import llama_cpp
    ref = np.load(fixture_dir(name) / "reference.npz")
    llm = llama_cpp.Llama(str(converted(name, "f32")), n_ctx=128, n_batch=128, logits_all=True, n_threads=2,
                          type_k=0, type_v=0, flash_attn=False, verbose=False, **WRAPPER_ROPE)
    got = _logits(llm, ref["tokens"])
    llm.close()
    err = rel_errors(got, ref["logits"])
    assert err.max() <= TOL, f"{name}: rope_freq_scale=1.0 overrode YaRN: max rel error {err.max():.3g}"
    assert (got.argmax(1) == ref["logits"].argmax(1)).all()


FORCED_CODE = r"""
import json, sys, numpy as np, llama_cpp
ref = np.load(sys.argv[1] if len(sys.argv) > 1 else {ref!r})
llm = llama_cpp.Llama({path!r}, n_ctx=128, n_batch=128, logits_all=True, n_threads=2, type_k=0, type_v=0,
                      flash_attn=False, verbose=False, rope_freq_scale=1.0, rope_freq_base=10000.0{extra})
llm.eval([int(t) for t in ref["tokens"]])
got = np.array(llm.scores[: len(ref["tokens"])], dtype=np.float32)
err = np.abs(got - ref["logits"]).max(axis=1) / np.abs(ref["logits"]).max(axis=1)
top1 = float((got.argmax(1) == ref["logits"].argmax(1)).mean())
print(json.dumps({{"err": float(err.max()), "top1": top1}}))
"""


@pytest.mark.parametrize("how", ["env", "rope_scaling_type"])
def test_override_can_still_be_forced(converted, how):
    """DEEPSEEK_CPU_FORCE_ROPE=1, or an explicit rope_scaling_type, keeps the caller's values
    (and then the logits are those of an unscaled model: far from the reference)."""
    name = "v2_group"
    path, ref = str(converted(name, "f32")), str(fixture_dir(name) / "reference.npz")
    extra = ", rope_scaling_type=llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN" if how == "rope_scaling_type" else ""
    env = {"DEEPSEEK_CPU_FORCE_ROPE": "1"} if how == "env" else {}
    r = run_python(FORCED_CODE.format(path=path, ref=ref, extra=extra), env_extra=env, unset=["DEEPSEEK_CPU_FORCE_ROPE"])
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["err"] > 1e-2, f"forced override had no effect: {out}"


def test_yarn_default_is_announced_in_the_log(converted):
    code = (f"import llama_cpp; llama_cpp.Llama({str(converted('v2_group', 'f32'))!r}, n_ctx=64, n_threads=1, "
            "verbose=True, rope_freq_scale=1.0, rope_freq_base=10000.0)")
    r = run_python(code, unset=["DEEPSEEK_CPU_FORCE_ROPE"])
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if "deepseek-cpu: model uses YaRN" in ln]
    assert len(lines) == 1, r.stderr[-3000:]
    assert "DEEPSEEK_CPU_FORCE_ROPE" in lines[0]


# --------------------------------------------------------------------------------------------
# LangChain and LlamaIndex, unchanged, vs Llama used directly
# --------------------------------------------------------------------------------------------

PROMPT = "the cat sat on the"
N_GEN = 32


def _direct(path, **kw):
    import llama_cpp
    return llama_cpp.Llama(str(path), n_ctx=512, n_threads=2, verbose=False, **kw)


@pytest.fixture(scope="module")
def yarn_gguf(converted):
    return converted("v2_lite", "f32")  # YaRN factor 40: the override changes greedy output early


@pytest.fixture(scope="module")
def direct_greedy(yarn_gguf):
    llm = _direct(yarn_gguf)
    out = llm.create_completion(PROMPT, max_tokens=N_GEN, temperature=0.0, repeat_penalty=1.0)
    chat = llm.create_chat_completion(messages=[{"role": "user", "content": PROMPT}], max_tokens=N_GEN,
                                      temperature=0.0, repeat_penalty=1.0)
    chat_stream = llm.create_chat_completion(messages=[{"role": "user", "content": PROMPT}], max_tokens=N_GEN,
                                             temperature=0.0, repeat_penalty=1.0, stream=True)
    chat_stream = "".join(c["choices"][0]["delta"].get("content") or "" for c in chat_stream)
    llm.close()
    return {"text": out["choices"][0]["text"], "chat": chat["choices"][0]["message"]["content"],
            "chat_stream": chat_stream}


def test_langchain_llamacpp_matches_llama(yarn_gguf, direct_greedy):
    from langchain_community.llms import LlamaCpp
    lc = LlamaCpp(model_path=str(yarn_gguf), temperature=0.0, max_tokens=N_GEN, repeat_penalty=1.0,
                  n_threads=2, verbose=False)
    assert lc.rope_freq_scale == 1.0 and lc.rope_freq_base == 10000.0  # what it passes, unchanged
    text = lc.invoke(PROMPT)
    assert len(direct_greedy["text"]) > 0
    assert text == direct_greedy["text"]


@pytest.mark.parametrize("streaming", [True, False])
def test_langchain_chat_llamacpp_matches_llama(yarn_gguf, direct_greedy, streaming):
    """ChatLlamaCpp streams by default (streaming=True), even in invoke(). llama-cpp-python's
    streamed text can lack characters its non-streamed text has (an incomplete UTF-8
    sequence is dropped, not held back), which the random tiny model triggers; so each
    mode is compared with the same mode of Llama."""
    from langchain_community.chat_models import ChatLlamaCpp
    lc = ChatLlamaCpp(model_path=str(yarn_gguf), temperature=0.0, max_tokens=N_GEN, repeat_penalty=1.0,
                      n_ctx=512, n_threads=2, verbose=False, streaming=streaming)
    assert lc.rope_freq_scale == 1.0 and lc.rope_freq_base == 10000.0
    msg = lc.invoke([("human", PROMPT)])
    assert msg.content == direct_greedy["chat_stream" if streaming else "chat"]


def test_langchain_embeddings_match_llama(yarn_gguf):
    from langchain_community.embeddings import LlamaCppEmbeddings
    lc = LlamaCppEmbeddings(model_path=str(yarn_gguf), n_threads=2, verbose=False)
    got = np.array(lc.embed_query(PROMPT))
    llm = _direct(yarn_gguf, embedding=True)
    want = llm.embed(PROMPT)
    want = np.array(want[0] if isinstance(want[0], list) else want)
    assert got.shape == want.shape and got.size > 0
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6)
    docs = lc.embed_documents([PROMPT, "a dog"])
    assert np.allclose(np.array(docs[0]), want, rtol=1e-5, atol=1e-6)


def test_llamaindex_llamacpp_matches_llama(yarn_gguf, direct_greedy):
    from llama_index.llms.llama_cpp import LlamaCPP
    li = LlamaCPP(model_path=str(yarn_gguf), temperature=0.0, max_new_tokens=N_GEN, context_window=512,
                  generate_kwargs={"repeat_penalty": 1.0}, model_kwargs={"n_threads": 2},
                  completion_to_prompt=lambda s: s, verbose=False)
    assert li.complete(PROMPT).text == direct_greedy["text"]
    streamed = "".join(r.delta or "" for r in li.stream_complete(PROMPT))
    assert streamed == direct_greedy["text"]


# --------------------------------------------------------------------------------------------
# chat templates: create_chat_completion formats as transformers' apply_chat_template
# --------------------------------------------------------------------------------------------

CHAT = json.loads((FIXTURES / "chat_templates.json").read_text())
CHAT_CASES = [(name, i) for name, cases in CHAT["cases"].items() for i in range(len(cases))]


@pytest.fixture(scope="module")
def chat_models(converted):
    from deepseek_cpu import Llama
    return {name: Llama(str(converted(name, "f32")), n_ctx=256, n_threads=1, verbose=False) for name in CHAT["cases"]}


class _Captured(Exception):
    pass


def _formatted_prompt(llm, messages):
    """The token ids create_chat_completion sends to the model (captured at create_completion)."""
    seen = {}

    def capture(prompt, *a, **kw):
        seen["prompt"] = prompt
        raise _Captured

    llm.create_completion = capture
    try:
        llm.create_chat_completion(messages=messages, max_tokens=1)
    except _Captured:
        pass
    finally:
        del llm.create_completion
    return list(seen["prompt"])


@pytest.mark.parametrize("name,i", CHAT_CASES)
def test_chat_template_matches_transformers(chat_models, name, i):
    case = CHAT["cases"][name][i]
    llm = chat_models[name]
    assert llm.chat_format == "chat_template.default"
    tmpl = json.loads((fixture_dir(name) / "tokenizer_config.json").read_text())["chat_template"]
    assert llm.metadata["tokenizer.chat_template"] == tmpl
    if case["add_generation_prompt"]:  # what create_chat_completion always asks for
        ids = _formatted_prompt(llm, case["messages"])
        assert ids == case["ids"], (llm.detokenize(ids, special=True).decode(), case["text"])
        assert llm.detokenize(ids, special=True).decode() == case["text"]
    # the formatter itself, with either add_generation_prompt
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    fmt = Jinja2ChatFormatter(template=tmpl, eos_token=llm._model.token_get_text(llm.token_eos()),
                              bos_token=llm._model.token_get_text(llm.token_bos()),
                              add_generation_prompt=case["add_generation_prompt"])
    r = fmt(messages=case["messages"])
    assert r.prompt == case["text"]
    assert llm.tokenize(r.prompt.encode(), add_bos=not r.added_special, special=True) == case["ids"]


def test_chat_fixture_covers_v2_and_v3_templates():
    assert set(CHAT["cases"]) == {"v2_group", "v3_noaux"}
    texts = [c["text"] for cs in CHAT["cases"].values() for c in cs]
    assert any("User: " in t for t in texts) and any("<｜User｜>" in t for t in texts)


# --------------------------------------------------------------------------------------------
# long conversations: reaching n_ctx ends with finish_reason="length"
# --------------------------------------------------------------------------------------------

N_CTX = 256


@pytest.fixture(scope="module")
def small_ctx(converted):
    from deepseek_cpu import Llama
    llm = Llama(str(converted("v2_greedy", "f32")), n_ctx=N_CTX, n_threads=2, verbose=False)
    return llm


def _no_eos(llm):
    return {llm.token_eos(): -100.0}


def test_stock_llama_raises_at_the_context_end(converted):
    """The scenario really overflows: llama-cpp-python itself raises mid-generation."""
    import llama_cpp
    llm = llama_cpp.Llama(str(converted("v2_greedy", "f32")), n_ctx=N_CTX, n_threads=2, verbose=False)
    with pytest.raises(RuntimeError, match="llama_decode returned 1"):
        llm.create_completion("the cat sat", max_tokens=600, temperature=0.0, logit_bias=_no_eos(llm))


@pytest.mark.parametrize("stream", [False, True])
def test_completion_ends_at_context_with_length(small_ctx, stream):
    llm = small_ctx
    kw = dict(max_tokens=600, temperature=0.0, logit_bias=_no_eos(llm))
    if stream:
        chunks = list(llm.create_completion("the cat sat", stream=True, **kw))
        finish = [c["choices"][0]["finish_reason"] for c in chunks]
        assert finish[-1] == "length" and all(f is None for f in finish[:-1])
        text = "".join(c["choices"][0]["text"] for c in chunks)
    else:
        r = llm.create_completion("the cat sat", **kw)
        assert r["choices"][0]["finish_reason"] == "length"
        assert r["usage"]["total_tokens"] <= N_CTX
        text = r["choices"][0]["text"]
    assert len(llm.tokenize(text.encode(), add_bos=False)) > N_CTX // 2
    assert llm.n_tokens <= N_CTX


@pytest.mark.parametrize("stream", [False, True])
def test_chat_ends_at_context_with_length(small_ctx, stream):
    llm = small_ctx
    messages = [{"role": "user", "content": "the cat sat"}, {"role": "assistant", "content": "on the mat"},
                {"role": "user", "content": "and then"}]
    kw = dict(max_tokens=600, temperature=0.0, logit_bias=_no_eos(llm))
    if stream:
        chunks = list(llm.create_chat_completion(messages=messages, stream=True, **kw))
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    else:
        r = llm.create_chat_completion(messages=messages, **kw)
        assert r["choices"][0]["finish_reason"] == "length"
        text = r["choices"][0]["message"]["content"]
    assert len(text) > 0
    # the same object keeps working afterwards
    r = llm.create_completion("the", max_tokens=4, temperature=0.0)
    assert r["choices"][0]["finish_reason"] in ("length", "stop")


def test_short_generation_unchanged(small_ctx, converted):
    """Below the context, our Llama gives exactly llama_cpp.Llama's output and finish_reason."""
    import llama_cpp
    stock = llama_cpp.Llama(str(converted("v2_greedy", "f32")), n_ctx=N_CTX, n_threads=2, verbose=False)
    for kw in ({"max_tokens": 20}, {"max_tokens": 40, "stop": ["e"]}):
        a = small_ctx.create_completion("the cat sat", temperature=0.0, **kw)
        b = stock.create_completion("the cat sat", temperature=0.0, **kw)
        assert a["choices"][0]["text"] == b["choices"][0]["text"]
        assert a["choices"][0]["finish_reason"] == b["choices"][0]["finish_reason"]


# --------------------------------------------------------------------------------------------
# logging: a log line cut inside a multi-byte character must not raise
# --------------------------------------------------------------------------------------------

LOAD_VERBOSE = "{imp}; import llama_cpp; llama_cpp.Llama({path!r}, n_ctx=64, n_threads=1, verbose=True)"


@pytest.mark.parametrize("name", ["v2_group", "v3_noaux"])
@pytest.mark.parametrize("imp", ["import deepseek_cpu.runtime.llama", "pass"])
def test_verbose_load_prints_no_traceback(converted, name, imp):
    """verbose=True prints the GGUF metadata, whose token lists hold DeepSeek's full-width
    special tokens; neither plain llama_cpp (fixes/loader-utf8-safe-metadata-truncation.patch) nor our Llama (safe
    callback) may print a UnicodeDecodeError traceback."""
    r = run_python(LOAD_VERBOSE.format(imp=imp, path=str(converted(name, "f32"))))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "tokenizer.ggml.tokens" in r.stderr  # the metadata dump was printed
    assert "Traceback" not in r.stderr and "UnicodeDecodeError" not in r.stderr, r.stderr[-3000:]


def test_safe_callback_joins_split_characters(capsys):
    import llama_cpp._logger as lg

    from deepseek_cpu.runtime import llama as dl
    old = lg.logger.level
    lg.set_verbose(True)
    try:
        ch = "<｜begin▁of▁sentence｜>".encode()
        dl.safe_log_callback(2, b"tok = " + ch[:3], None)   # cut inside "｜"
        dl.safe_log_callback(5, ch[3:] + b"\n", None)
        dl.safe_log_callback(2, b"bad \xff\xfe end\n", None)  # not UTF-8 at all
    finally:
        lg.logger.setLevel(old)
    err = capsys.readouterr().err
    assert "tok = <｜begin▁of▁sentence｜>\n" in err
    assert "bad \ufffd\ufffd end" in err
    import llama_cpp
    assert lg.llama_log_callback is dl.safe_log_callback and llama_cpp  # installed process-wide
