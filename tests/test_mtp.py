"""Multi-token prediction (issue 49): DeepSeek's own MTP head drafting for speculative decoding.

- The engine's MTP head (llama.cpp's MTP graph on our converter's `blk.N.nextn.*`) against an
  independent torch implementation built from transformers' DeepSeek-V3 layer
  (reference_mtp.npz, tests/fixtures/make_mtp_fixture.py): the main model's hidden state it reads
  and the logits it drafts from.
- Decoding with it gives the tokens decoding without it gives, greedy and sampled (same seed: the
  sampler draws once per kept token either way), for 1-3 drafts a step, V3, V3.2 and V4.
- On a model trained here with its MTP head (trained_v3_mtp), drafts are kept often enough to
  yield more than one token per decode step; how often is measured, not assumed.
- A model without an MTP layer says so in one line and decodes as usual; a bad draft count is a
  one-line error.
"""
import ctypes
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import fixture_dir
from test_mtp_convert import mtp_ggufs, v32_mtp  # noqa: F401  (module fixtures: MTP GGUFs of V3, V3.2, V4)

TRAINED = "trained_v3_mtp"
HAS_TRAINED = (fixture_dir(TRAINED) / "config.json").exists()
TOL = 1e-4
# prompt tokens for the random-weight fixtures (their vocabularies have >= 400 tokens)
PROMPT = [1, 17, 230, 5, 91, 300, 44, 12, 160, 77, 8, 250]


def _llama(path, **kw):
    from deepseek_cpu import Llama
    return Llama(str(path), n_ctx=512, n_threads=2, verbose=False, **kw)


def _generate(llm, prompt, n, **sampling):
    out = []
    for tok in llm.generate(prompt, reset=True, **sampling):
        out.append(int(tok))
        if len(out) >= n:
            break
    return out


@pytest.fixture(scope="module")
def v4_swa_mtp(tmp_path_factory):
    """v4_flash with its MTP layer on sliding-window attention only (compress ratio 0, as
    DeepSeek-V4-Flash's config has it; the fixture's own MTP layer uses ratio 4, which llama.cpp's
    V4 MTP graph does not run): the MTP layer's compressor and indexer tensors dropped."""
    from deepseek_cpu.conversion.convert import convert
    from deepseek_cpu.converters.checkpoint import Checkpoint
    from test_mtp_convert import write_checkpoint
    src = fixture_dir("v4_flash")
    ck = Checkpoint(src)
    drop = {n: None for n in ck.names() if n.startswith("mtp.") and (".compressor." in n or ".indexer." in n)}
    ck.close()
    cfg = json.loads((src / "config.json").read_text())
    d = tmp_path_factory.mktemp("v4_swa_mtp")
    ckpt = write_checkpoint(src, d / "ckpt", drop, {"compress_ratios": cfg["compress_ratios"][:-1] + [0]})
    return convert(ckpt, d / "v4-swa-mtp.gguf", outtype="f32", progress=False)


@pytest.fixture(scope="module")
def drafting(mtp_ggufs, v4_swa_mtp):  # noqa: F811
    """name -> GGUF with an MTP layer that drafts: V3 (deepseek2), V3.2 (deepseek32), V4 (deepseek4)."""
    return {"v3_mtp": mtp_ggufs["v3_mtp"][0], "v32_mtp": mtp_ggufs["v32_mtp"][0], "v4_mtp": v4_swa_mtp}


@pytest.fixture(scope="module")
def trained_gguf(tmp_path_factory):
    if not HAS_TRAINED:
        pytest.fail(f"tests/fixtures/{TRAINED} is missing (tests/fixtures/make_trained_mtp_fixture.py writes it)")
    from deepseek_cpu.conversion.convert import convert
    return convert(fixture_dir(TRAINED), tmp_path_factory.mktemp("trained_mtp") / "t.gguf", outtype="f32",
                   progress=False)


# --- the head against the oracle -------------------------------------------------------------

def head_outputs(gguf, tokens, h_in=None):
    """(the main model's h for every token, the MTP head's logits for the pairs (h_{p-1}, token p),
    p = 1..n-1, h from `h_in` if given, else the engine's own): llama.cpp's MTP context driven
    directly, not through our drafter."""
    from llama_cpp import llama_cpp as C
    from deepseek_cpu.runtime.mtp_draft import CONTEXT_TYPE_MTP, PROCESS_DECODE, _nextn_api
    llm = _llama(gguf, mtp=1, type_k=0, type_v=0)
    api = _nextn_api()
    ctx, n = llm._ctx.ctx, len(tokens)
    n_embd = C.llama_model_n_embd_out(llm._model.model)
    llm.eval(list(tokens))
    h = np.ctypeslib.as_array(api["get"](ctx), shape=(n * n_embd,)).reshape(n, n_embd).copy()
    p = C.llama_context_default_params()
    p.ctx_type, p.n_ctx, p.n_batch, p.n_ubatch, p.type_k, p.type_v = CONTEXT_TYPE_MTP, 256, 256, 256, 0, 0
    p.flash_attn_type = 0  # off, as the main context (deepseek_cpu.Llama's default)
    mctx = C.llama_init_from_model(llm._model.model, p)
    batch = C.llama_batch_ext_init(mctx)
    rows = np.ascontiguousarray(h if h_in is None else h_in, dtype=np.float32)
    for pos in range(1, n):
        i = C.llama_batch_ext_add_token(batch, 0, int(tokens[pos]))
        C.llama_batch_ext_set_pos(batch, i, ctypes.byref(ctypes.c_int32(pos)))
        ptr = ctypes.cast(rows.ctypes.data + (pos - 1) * rows.strides[0], ctypes.POINTER(ctypes.c_float))
        C.llama_batch_ext_set_embd_token(batch, i, C.llama_embd(ptr, 1, n_embd))
        C.llama_batch_ext_set_output_logits(batch, i, True)
    assert C.llama_process(mctx, PROCESS_DECODE, batch) == 0
    nv = llm.n_vocab()
    logits = np.ctypeslib.as_array(C.llama_get_logits(mctx), shape=((n - 1) * nv,)).reshape(n - 1, nv).copy()
    C.llama_batch_ext_free(batch)
    C.llama_free(mctx)
    llm.close()
    return h, logits


@pytest.mark.parametrize("name", ["v3_mtp", TRAINED])
def test_head_matches_the_torch_reference(converted, name):
    ref_path = fixture_dir(name) / "reference_mtp.npz"
    if not ref_path.exists():
        pytest.fail(f"{ref_path} is missing (tests/fixtures/make_mtp_fixture.py writes it)")
    ref = np.load(ref_path)
    rel = lambda got, want: np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)  # noqa: E731
    h, _ = head_outputs(converted(name, "f32"), ref["tokens"])
    assert rel(h, ref["hidden"]).max() <= TOL, "the main model's hidden state (what the head reads)"
    # the head itself, on the reference's hidden states (the main model's own error not compounded)
    _, logits = head_outputs(converted(name, "f32"), ref["tokens"], h_in=ref["hidden"])
    err = rel(logits, ref["mtp_logits"])
    assert err.max() <= TOL, f"{name}: MTP logits max relative error {err.max():.3g} at pair {err.argmax()}"
    assert (logits.argmax(1) == ref["mtp_logits"].argmax(1)).all()


# --- decoding with drafts: the same tokens ---------------------------------------------------

@pytest.mark.parametrize("n_draft", [1, 2, 3])
@pytest.mark.parametrize("name", ["v3_mtp", "v32_mtp", "v4_mtp"])
def test_greedy_tokens_are_the_same_with_drafts(drafting, name, n_draft):
    path = drafting[name]
    want = _generate(_llama(path), PROMPT, 40, temp=0.0)
    llm = _llama(path, mtp=n_draft)
    assert llm.mtp_stats is not None, "MTP should be on for a model with an MTP layer"
    got = _generate(llm, PROMPT, 40, temp=0.0)
    assert got == want
    st = llm.mtp_stats
    assert st.steps > 0 and st.drafted == st.steps * n_draft, st.as_dict()


@pytest.mark.parametrize("name", ["v3_mtp", "v4_mtp"])
def test_sampled_tokens_are_the_same_with_drafts(drafting, name):
    """Every kept token is the sampler's draw from the main model's logits, one draw per token
    with or without drafts: with one seed, the same text."""
    kw = dict(temp=0.9, top_k=40, top_p=0.95)
    want = _generate(_llama(drafting[name], seed=11), PROMPT, 40, **kw)
    assert _generate(_llama(drafting[name], seed=11, mtp=2), PROMPT, 40, **kw) == want


def test_v4_mtp_layer_on_compressed_attention_says_so(mtp_ggufs, capfd):  # noqa: F811
    """The v4_flash fixture's MTP layer uses compressed attention, which llama.cpp's V4 MTP graph
    asserts against (an abort): refused in one line, before any MTP context exists."""
    path = mtp_ggufs["v4_flash"][0]
    capfd.readouterr()
    llm = _llama(path, mtp=1)
    assert "MTP off: this V4 file's MTP layer uses compressed attention" in capfd.readouterr().err
    assert llm.mtp_stats is None and len(_generate(llm, PROMPT, 4, temp=0.0)) == 4


def test_new_prompts_and_reused_prefixes(mtp_ggufs):  # noqa: F811
    """Completions one after another on one Llama (llama-cpp-python reuses the common prefix of
    the cache): the head's own cache follows the main one back, every text as without drafts."""
    path = mtp_ggufs["v3_mtp"][0]
    plain, drafted = _llama(path), _llama(path, mtp=1)
    for prompt in (PROMPT, PROMPT[:6] + [33, 34], PROMPT, [5, 6, 7]):
        want = plain.create_completion(prompt, max_tokens=24, temperature=0)["choices"][0]["text"]
        got = drafted.create_completion(prompt, max_tokens=24, temperature=0)["choices"][0]["text"]
        assert got == want


def test_trained_head_yields_more_tokens_per_step(trained_gguf):
    """On text like its training text, the trained head's drafts are mostly kept."""
    text = (fixture_dir("..") / "fixtures" / "text" / "heldout.txt").read_text()
    start = text.index("def ")
    plain, drafted = _llama(trained_gguf), _llama(trained_gguf, mtp=1)
    prompt = plain.tokenize(text[start:start + 400].encode(), add_bos=True)
    want = _generate(plain, prompt, 96, temp=0.0)
    assert _generate(drafted, prompt, 96, temp=0.0) == want
    st = drafted.mtp_stats
    print("trained_v3_mtp, 1 draft:", st.as_dict())
    assert st.acceptance >= 0.3, st.as_dict()
    assert st.tokens_per_step >= 1.3, st.as_dict()


# --- what users see ------------------------------------------------------------------------

def test_model_without_mtp_says_so_and_decodes(mtp_ggufs, capfd):  # noqa: F811
    path = mtp_ggufs["v3_mtp"][1]  # converted with mtp=False
    want = _generate(_llama(path), PROMPT, 12, temp=0.0)
    capfd.readouterr()
    llm = _llama(path, mtp=True)
    err = capfd.readouterr().err
    assert "MTP off: the model has no MTP layer" in err and err.count("MTP off") == 1
    assert llm.mtp_stats is None
    assert _generate(llm, PROMPT, 12, temp=0.0) == want


@pytest.mark.parametrize("bad", [4, -1, "two"])
def test_bad_draft_count_is_one_error(mtp_ggufs, bad):  # noqa: F811
    with pytest.raises(ValueError, match="mtp must be a number of draft tokens 0..3"):
        _llama(mtp_ggufs["v3_mtp"][0], mtp=bad)


def test_run_reports_drafts(mtp_ggufs):  # noqa: F811
    path = mtp_ggufs["v3_mtp"][0]
    p = subprocess.run([sys.executable, "-m", "deepseek_cpu", "run", str(path), "-p", "hello", "-n", "16", "--mtp", "2"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "MTP drafts kept" in p.stderr and "tokens/step" in p.stderr
    p = subprocess.run([sys.executable, "-m", "deepseek_cpu", "run", str(path), "-p", "hello", "--mtp", "5"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "--mtp" in p.stderr


def test_bench_mtp_compares_with_and_without(mtp_ggufs, tmp_path):  # noqa: F811
    path = mtp_ggufs["v3_mtp"][0]
    out = tmp_path / "b.json"
    p = subprocess.run([sys.executable, "-m", "deepseek_cpu", "bench", str(path), "--pp", "16", "--tg", "24",
                        "--ctx-depth", "0", "--repeat", "1", "--mtp", "2", "--no-warm-load", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    assert set(res["engines"]) == {"ours", "ours+mtp"}
    assert res["mtp_same_tokens"] is True
    run = res["engines"]["ours+mtp"]["runs"][0]
    assert run["mtp"]["steps"] > 0 and run["mtp"]["drafted"] == 2 * run["mtp"]["steps"]
    assert "tg_text_tok_s" in res["ratios_ours_mtp_over_ours"]
    assert "MTP drafts kept" in p.stdout and "same greedy tokens" in p.stdout


def test_serve_mtp_drafts_and_answers_the_same(mtp_ggufs, tmp_path):  # noqa: F811
    """serve --mtp: llama-server drafts with the head (its timings count drafts) and the greedy
    reply is the one decoding without drafts gives."""
    from served import Served, post
    path = mtp_ggufs["v3_mtp"][0]
    want = _generate(_llama(path), PROMPT, 24, temp=0.0)
    srv = Served(path, tmp_path / "serve.log", "--mtp", parallel=1, ctx=512)
    try:
        body = {"prompt": PROMPT, "n_predict": 24, "temperature": 0, "return_tokens": True, "cache_prompt": False}
        status, text = post(srv.url + "/completion", json.dumps(body).encode())
        assert status == 200, text
        res = json.loads(text)
        assert res["tokens"] == want
        assert res["timings"].get("draft_n", 0) > 0, res["timings"]
    finally:
        srv.stop()
