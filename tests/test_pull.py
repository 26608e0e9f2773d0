"""`deepseek-cpu pull` / `Llama.from_hub` against a local hub (tests/hubserver.py).

The server speaks the hub's protocol to the real huggingface_hub client and serves the
fixture checkpoints as repos the way huggingface.co does (weights by a 302 to a CDN host,
X-Linked-Etag, Range, 429s on demand); every test gets its own HF cache and GGUF cache in tmp.
"""
import hashlib
import json
import os
import pkgutil
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import REPO as SRC, fixture_dir, run_python
from hubserver import HubServer

pytest.importorskip("huggingface_hub")

from deepseek_cpu import hub as hubmod  # noqa: E402
from deepseek_cpu.hub import client as hubclient, disk_plan  # noqa: E402
from deepseek_cpu.cli import cli  # noqa: E402

REPO = "deepseek-ai/tiny-v2-group"
SHARD1 = "model-00001-of-00002.safetensors"


def make_repo(dst: Path, fixture: str = "v2_group", config_edit=None, extra: dict | None = None) -> Path:
    """A repo directory: the fixture's files (linked), optionally an edited config.json and
    extra files (junk the pull must not download)."""
    dst.mkdir(parents=True)
    for f in fixture_dir(fixture).iterdir():
        if f.name == "config.json" and config_edit:
            cfg = json.loads(f.read_text())
            config_edit(cfg)
            (dst / f.name).write_text(json.dumps(cfg))
        else:
            os.symlink(f, dst / f.name)
    for name, data in (extra or {}).items():
        (dst / name).write_bytes(data)
    return dst


@pytest.fixture
def hub(tmp_path, monkeypatch):
    repo_dir = make_repo(tmp_path / "repo", extra={"pytorch_model.bin": b"\0" * 1000, "optimizer.pt": b"\0" * 100,
                                                    "README.md": b"# tiny\n"})
    srv = HubServer({REPO: repo_dir}, lifetime=300).start()
    monkeypatch.setenv("HF_ENDPOINT", srv.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("DEEPSEEK_CPU_CACHE", str(tmp_path / "cache"))  # the root: GGUFs go to its gguf/
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HOME"):
        monkeypatch.delenv(var, raising=False)
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))  # ignore a saved login
    # huggingface_hub 2.x fetches an "agent harnesses" registry from {import-time endpoint}/api/agent-harnesses
    # once per process (for its user-agent); keep the tests off the network
    from huggingface_hub.utils import _detect_agent
    monkeypatch.setattr(_detect_agent, "_registry", _detect_agent._EMPTY_REGISTRY)
    monkeypatch.setattr(hubclient, "RETRY_DELAYS", (0.05, 0.05, 0.05))  # where the client reads it
    yield srv
    srv.stop()


def pull(*args):
    res = CliRunner().invoke(cli, ["pull", REPO, "--quiet", *args])
    assert "Traceback" not in res.output
    return res


def gguf_path(res) -> Path:
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[1].startswith('python -c "from deepseek_cpu import Llama;') and lines[0] in lines[1]
    return Path(lines[0])


def weight_requests(srv: HubServer) -> list:
    return [r for r in srv.requests if r.file and r.file.endswith((".safetensors", ".bin", ".pt"))]


def files_state(*roots: Path) -> dict:
    """Every file (and link) under `roots` with its size, mtime and inode: writing to one, or
    replacing it, or adding one, changes the result."""
    return {p: (st.st_size, st.st_mtime_ns, st.st_ino)
            for root in roots for p in root.rglob("*") if not stat.S_ISDIR((st := p.lstat()).st_mode)}


def test_pull_f32_matches_reference_and_fetches_only_what_converts(hub):
    from test_parity import TOL, engine_logits, rel_errors
    path = gguf_path(pull("--quant", "f32"))
    assert path.is_file() and path.name == "tiny-v2-group-f32.gguf"
    got = sorted(set(hub.fetched()))
    assert got == sorted(["config.json", "model.safetensors.index.json", SHARD1, "model-00002-of-00002.safetensors",
                          "tokenizer.json", "tokenizer_config.json"])  # no .bin/.pt/README/reference.npz
    ref = np.load(fixture_dir("v2_group") / "reference.npz")
    err = rel_errors(engine_logits(path, ref["tokens"]), ref["logits"])
    assert err.max() <= TOL, err
    import gguf
    name = gguf.GGUFReader(path).get_field("general.name")
    assert name.contents() == "tiny-v2-group"  # the repo's name, not the snapshot's commit sha


def test_second_pull_is_served_from_cache(hub, monkeypatch, tmp_path):
    first = gguf_path(pull("--quant", "q8_0"))
    # under <DEEPSEEK_CPU_CACHE>/gguf: <org>--<name>/<sha>/<converter key>/<name>-<quant>.gguf
    rel = first.relative_to(tmp_path / "cache" / "gguf")
    assert rel.parts[0] == REPO.replace("/", "--") and re.fullmatch(r"[0-9a-f]{40}", rel.parts[1])
    assert rel.parts[2:] == (hubmod.converter_key(), "tiny-v2-group-q8_0.gguf")
    assert (tmp_path / "cache" / "gguf" / REPO.replace("/", "--") / "refs" / "main").read_text() == rel.parts[1]
    caches = (tmp_path / "hf", tmp_path / "cache")
    before = files_state(*caches)
    hub.requests.clear()
    assert gguf_path(pull("--quant", "q8_0")) == first
    # online: only the revision is resolved (branch -> sha); no file is asked for, none is
    # written (no download, no conversion, not even a record or ref rewritten)
    assert [r.path for r in hub.requests] == [f"/api/models/{REPO}/revision/main"]
    assert files_state(*caches) == before
    # offline: no request at all
    hub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert gguf_path(pull("--quant", "q8_0")) == first
    assert hub.requests == [] and files_state(*caches) == before
    # a new quant offline converts from the cached snapshot, still without the network
    f32 = gguf_path(pull("--quant", "f32"))
    assert f32.is_file() and hub.requests == []


def test_offline_without_cache_is_a_clear_error(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = pull("--quant", "q8_0")
    assert res.exit_code == 1 and "HF_HUB_OFFLINE=1" in res.output and "network access" in res.output
    assert hub.requests == []


def test_q4_k_m_from_hub_loads_and_runs(hub, converted, tmp_path):
    import gguf
    from deepseek_cpu import Llama
    from test_parity import engine_logits, rel_errors
    llm = Llama.from_hub(REPO, quant="q4_k_m", progress=False, n_ctx=64, n_threads=2, logits_all=True, verbose=False)
    try:
        path = Path(llm.model_path)
        ftype = gguf.GGUFReader(path).fields["general.file_type"]
        assert int(ftype.parts[ftype.data[0]][0]) == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
        tokens = [int(t) for t in np.load(fixture_dir("v2_group") / "reference.npz")["tokens"]]
        llm.eval(tokens)
        assert np.isfinite(np.array(llm.scores[: len(tokens)])).all()
    finally:
        llm.close()
    assert oct(path.stat().st_mode & 0o777) != oct(0o600)  # not left with mkstemp's private mode
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".json"]  # no temp files left

    # Logits of random tiny weights say little about a 4-bit file (max relative error ~0.12
    # against the reference; with two layers' attn_q_b swapped, 0.18). So, in two steps:
    # 1. Each tensor of the file, dequantized, is the f32 conversion's (itself checked against
    #    transformers), up to quantization noise: measured relative RMS <= 0.044 (these 64-wide
    #    rows fall back to q5_0 / q8_0); a transposed or swapped tensor measures >= 1.41.
    f32 = converted("v2_group", "f32")
    want = {t.name: np.asarray(t.data, np.float32) for t in gguf.GGUFReader(f32).tensors}
    got = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in gguf.GGUFReader(path).tensors}
    assert sorted(got) == sorted(want)
    for name, w in got.items():
        assert w.shape == want[name].shape, name
        err = np.sqrt(np.mean((w - want[name]) ** 2) / np.mean(want[name] ** 2))
        assert err < 0.1, f"{name}: relative RMS error {err:.3f} against the f32 conversion"
    # 2. The engine computes with the file what those weights compute: the f32 file holding the
    #    dequantized weights gives the same logits, up to the rounding of activations in quantized
    #    dot products (measured max 0.016; against the f32 file's own weights it is 0.12).
    deq = tmp_path / "dequantized.gguf"
    shutil.copy(f32, deq)
    r = gguf.GGUFReader(deq, "r+")
    for t in r.tensors:
        t.data[...] = got[t.name].reshape(t.data.shape)
    r.data.flush()
    del r
    err = rel_errors(engine_logits(path, tokens), engine_logits(deq, tokens))
    assert err.max() < 0.04, err


def test_output_dir_and_delete_snapshot(hub, tmp_path, monkeypatch):
    out = tmp_path / "out"
    path = gguf_path(pull("--quant", "q8_0", "--output-dir", str(out), "--delete-snapshot"))
    assert path == out / "tiny-v2-group-q8_0.gguf" and path.is_file()
    assert json.loads(path.with_name(path.name + ".json").read_text())["quant"] == "q8_0"
    snaps = list((tmp_path / "hf").glob("models--*/snapshots/*"))
    assert snaps == [] and not list((tmp_path / "hf").glob("models--*/blobs/*"))
    # still reusable afterwards, offline too (the GGUF cache keeps its own refs)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.requests.clear()
    assert gguf_path(pull("--quant", "q8_0", "--output-dir", str(out))) == path and hub.requests == []


def test_revision_by_sha_and_unknown_revision(hub):
    sha = hub.repos[REPO].sha
    path = gguf_path(pull("--quant", "q8_0", "--revision", sha))
    assert sha in str(path)
    hub.requests.clear()
    assert gguf_path(pull("--quant", "q8_0", "--revision", sha)) == path and hub.requests == []  # a sha needs no lookup
    res = pull("--quant", "q8_0", "--revision", "v9")
    assert res.exit_code == 1 and "revision 'v9' not found" in res.output


def test_hub_unreachable_falls_back_to_what_was_pulled(hub, monkeypatch):
    first = gguf_path(pull("--quant", "q8_0"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert gguf_path(pull("--quant", "q8_0")) == first


def test_cache_locations_follow_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hubmod.hf_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hc"))
    assert hubmod.hf_cache_dir() == tmp_path / "hc"
    monkeypatch.delenv("DEEPSEEK_CPU_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hubmod.gguf_cache_dir() == tmp_path / "xdg" / "deepseek-cpu" / "gguf"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hubmod.gguf_cache_dir() == tmp_path / "home" / ".cache" / "deepseek-cpu" / "gguf"


@pytest.mark.parametrize("env", [{"DEEPSEEK_CPU_CACHE": "root"}, {"XDG_CACHE_HOME": "xdg"}, {"HOME": "home"}])
def test_deepseek_cpu_cache_is_one_root_for_every_cache(monkeypatch, tmp_path, env):
    """DEEPSEEK_CPU_CACHE (else $XDG_CACHE_HOME/deepseek-cpu, else ~/.cache/deepseek-cpu) is the
    root of every cache: pull's gguf/, stock-<commit>/, synth's tokenizers/, the build's sdist/."""
    import importlib.util

    from deepseek_cpu import cache
    from deepseek_cpu.tools import stock, synth
    for var in ("DEEPSEEK_CPU_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, str(tmp_path / value))
    root = {"DEEPSEEK_CPU_CACHE": tmp_path / "root", "XDG_CACHE_HOME": tmp_path / "xdg" / "deepseek-cpu",
            "HOME": tmp_path / "home" / ".cache" / "deepseek-cpu"}[next(iter(env))]
    assert cache.cache_root() == root
    assert hubmod.gguf_cache_dir() == root / "gguf"
    assert stock.cache_root is cache.cache_root and synth.cache_root is cache.cache_root
    assert stock.stock_dir("c" * 40).parent == root
    # vendor/prepare.py runs before the package exists and keeps its own copy of the rule
    spec = importlib.util.spec_from_file_location("_prepare_for_test", SRC / "vendor" / "prepare.py")
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    assert prepare.cache_dir() == root / "sdist"


def test_repo_not_found(hub):
    res = CliRunner().invoke(cli, ["pull", "deepseek-ai/no-such-model", "--quiet"])
    assert res.exit_code == 1
    assert "deepseek-ai/no-such-model: repository not found" in res.output and "HF_TOKEN" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_gated_repo_needs_a_token(hub):
    hub.gated[REPO] = "hf_secret"
    res = pull("--quant", "q8_0")
    assert res.exit_code == 1 and "gated (401)" in res.output and "HF_TOKEN" in res.output
    assert weight_requests(hub) == []
    res = pull("--quant", "q8_0", "--token", "hf_wrong")
    assert res.exit_code == 1 and "your token has no access" in res.output
    assert gguf_path(pull("--quant", "q8_0", "--token", "hf_secret")).is_file()
    # the weights came from the CDN's signed URLs, and the token never left the hub
    assert {h for h, _ in hub.transfers(SHARD1)} == {"cdn"}
    assert [r for r in hub.requests if r.host == "cdn" and r.auth] == []


def test_gated_repo_with_hf_token_env(hub, monkeypatch):
    hub.gated[REPO] = "hf_secret"
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert gguf_path(pull("--quant", "q8_0")).is_file()
    assert [r for r in hub.requests if r.host == "cdn" and r.auth] == []  # the token never left the hub


def test_unsupported_architecture_refused_before_any_weight(hub, tmp_path):
    def mixtral(cfg):
        cfg["architectures"] = ["MixtralForCausalLM"]
        cfg["model_type"] = "mixtral"
    hub.add("mistralai/tiny-mixtral", make_repo(tmp_path / "mixtral", config_edit=mixtral))
    res = CliRunner().invoke(cli, ["pull", "mistralai/tiny-mixtral", "--quiet"])
    assert res.exit_code == 1
    assert "architecture MixtralForCausalLM is not supported" in res.output
    assert "DeepseekV2ForCausalLM" in res.output
    assert weight_requests(hub) == []
    assert hub.fetched() == ["config.json"]


def test_not_enough_disk_stops_before_downloading(hub, monkeypatch):
    monkeypatch.setattr(disk_plan, "free_bytes", lambda path: 5 << 20)  # where the disk check reads it
    res = pull("--quant", "q4_k_m")
    assert res.exit_code == 1
    msg = res.output
    assert "not enough disk space" in msg and "download" in msg and "intermediate" in msg and "output" in msg
    assert "5.0 MiB free" in msg
    assert weight_requests(hub) == []


def test_download_cut_mid_file_is_resumed(hub, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16384)  # resume granularity (10 MiB by default)
    hub.cut_once[SHARD1] = 100_000
    path = gguf_path(pull("--quant", "q8_0"))
    # the hub redirected to the CDN; the bytes came from there, the rest by a Range request
    (host1, range1), (host2, range2) = hub.transfers(SHARD1)
    assert host1 == host2 == "cdn" and range1 is None
    assert 0 < int(re.fullmatch(r"bytes=(\d+)-", range2)[1]) <= 100_000
    snap = next((Path(os.environ["HF_HUB_CACHE"])).glob(f"models--*/snapshots/*/{SHARD1}"))
    assert hashlib.sha256(snap.read_bytes()).digest() == hashlib.sha256((fixture_dir("v2_group") / SHARD1).read_bytes()).digest()
    assert path.is_file()


def blobs_dir() -> Path:
    return Path(os.environ["HF_HUB_CACHE"]) / f"models--{REPO.replace('/', '--')}" / "blobs"


def test_pull_killed_mid_file_resumes_in_the_next_process(hub):
    from test_parity import TOL, engine_logits, rel_errors
    chunk = 16384  # huggingface_hub writes in DOWNLOAD_CHUNK_SIZE pieces (10 MiB by default)
    hub.stall_once[SHARD1] = 200_000
    code = ("import sys; from huggingface_hub import constants; constants.DOWNLOAD_CHUNK_SIZE = %d; "
            "from deepseek_cpu.cli import main; sys.argv[0] = 'deepseek-cpu'; main()" % chunk)
    proc = subprocess.Popen([sys.executable, "-c", code, "pull", REPO, "--quiet", "--quant", "f32"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    have = 200_000 // chunk * chunk
    # the stalled shard's partial file by name: other files' partials come and go (renamed to
    # their blobs when done) while this loop looks
    etag = hashlib.sha256((fixture_dir("v2_group") / SHARD1).read_bytes()).hexdigest()
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            partial = [p for p in [blobs_dir() / f"{etag}.dscpu-partial"] if p.exists()]
            if partial and partial[0].stat().st_size >= have:
                break
            assert proc.poll() is None, proc.stdout.read().decode()
            time.sleep(0.05)
        else:
            pytest.fail("the first pull never got to the stalled shard")
    finally:
        proc.kill()  # SIGKILL: no cleanup handler runs
        proc.wait()
    assert partial[0].stat().st_size == have
    assert not (blobs_dir() / partial[0].name.removesuffix(".dscpu-partial")).exists()

    hub.requests.clear()
    path = gguf_path(pull("--quant", "f32"))
    assert hub.transfers(SHARD1) == [("cdn", f"bytes={have}-")]  # one request, for the rest of the file only
    assert list(blobs_dir().glob("*.dscpu-partial")) == []
    snap = next(Path(os.environ["HF_HUB_CACHE"]).glob(f"models--*/snapshots/*/{SHARD1}"))
    assert snap.read_bytes() == (fixture_dir("v2_group") / SHARD1).read_bytes()
    ref = np.load(fixture_dir("v2_group") / "reference.npz")
    err = rel_errors(engine_logits(path, ref["tokens"]), ref["logits"])
    assert err.max() <= TOL, err


def test_corrupt_partial_file_is_detected_and_fetched_again(hub, caplog):
    data = (fixture_dir("v2_group") / SHARD1).read_bytes()
    etag = hashlib.sha256(data).hexdigest()
    blobs_dir().mkdir(parents=True)
    (blobs_dir() / f"{etag}.dscpu-partial").write_bytes(b"\x55" * 100_000)  # not the file's first bytes
    path = gguf_path(pull("--quant", "q8_0"))
    assert hub.transfers(SHARD1) == [("cdn", "bytes=100000-"), ("cdn", None)]  # resumed, failed the sha256, fetched whole
    assert (blobs_dir() / etag).read_bytes() == data
    assert "does not match" in caplog.text
    assert path.is_file()


def test_resumed_lfs_file_is_checked_against_x_linked_etag(hub, monkeypatch, caplog):
    """The shard's transfer from the CDN is cut and resumed with a Range request, and a byte of
    the resumed part arrives flipped: sizes agree, only the sha256 that the hub's 302 gave in
    X-Linked-Etag (the CDN's own ETag is an md5) can tell. The pull must catch it and fetch the
    file again."""
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16384)
    data = (fixture_dir("v2_group") / SHARD1).read_bytes()
    hub.cut_once[SHARD1] = 100_000
    hub.corrupt_once[SHARD1] = 300_000  # past the cut: in the resumed response
    path = gguf_path(pull("--quant", "q8_0"))
    (h1, r1), (h2, r2), (h3, r3) = hub.transfers(SHARD1)
    assert h1 == h2 == h3 == "cdn" and r1 is None and r2.startswith("bytes=") and r3 is None
    assert hub.corrupt_once == {}  # the flipped byte was sent
    assert "does not match" in caplog.text
    assert (blobs_dir() / hashlib.sha256(data).hexdigest()).read_bytes() == data
    assert list(blobs_dir().glob("*.dscpu-partial")) == []
    assert path.is_file()


def test_rate_limited_hub_is_retried_after_retry_after(hub):
    # The shard's HEAD gets 429 "Retry-After: 1", and the hub keeps refusing for that second.
    # The fixture's retry delays are 0.05 s: a client that ignored Retry-After would spend
    # its retries inside the window and fail.
    hub.rate_limit_once[SHARD1] = 1
    assert gguf_path(pull("--quant", "q8_0")).is_file()
    answers = [r.status for r in hub.requests if r.host == "hub" and r.file == SHARD1]
    assert answers[:2] == [429, 302]  # refused once, and the retry came after the window
    assert sum(r.status == 429 for r in hub.requests) == 1


def test_a_long_rate_limit_ends_the_pull_with_a_clear_message(hub):
    # Retry-After: 3600 -- waiting it out would look like a hung pull; the user is told instead
    hub.rate_limit_once[SHARD1] = 3600
    res = pull("--quant", "q8_0")
    assert res.exit_code == 1 and "rate-limits this client for 3600 s" in res.output, res.output
    assert sum(r.status == 429 for r in hub.requests) == 1  # no retry into the window


def test_the_hub_stand_in_says_the_window_it_was_given(hub, monkeypatch):
    # At some clock readings (t + 3600) - t is 3600.0000000000005 in floating point: the stand-in
    # once rounded that up and said "Retry-After: 3601", and the test above failed at random
    import hubserver
    monkeypatch.setattr(hubserver, "clock", lambda: 1000.1)
    assert (1000.1 + 3600) - 1000.1 > 3600  # the reading that went wrong
    hub.rate_limit_once[SHARD1] = 3600
    res = pull("--quant", "q8_0")
    assert res.exit_code == 1 and "rate-limits this client for 3600 s" in res.output, res.output


def test_files_finished_by_an_interrupted_run_are_not_fetched_again(hub):
    # A killed run leaves its finished files in the HF cache, whoever downloaded them.
    from huggingface_hub import hf_hub_download
    for f in ("config.json", SHARD1):
        hf_hub_download(REPO, f, endpoint=hub.url, cache_dir=os.environ["HF_HUB_CACHE"])
    blobs = Path(os.environ["HF_HUB_CACHE"]) / f"models--{REPO.replace('/', '--')}" / "blobs"
    (blobs / "0123abcd.deadbeef.incomplete").write_bytes(b"junk")  # a stray partial file is harmless
    hub.requests.clear()
    gguf_path(pull("--quant", "q8_0"))
    assert SHARD1 not in hub.fetched() and "model-00002-of-00002.safetensors" in hub.fetched()


def test_hub_errors_are_retried_with_backoff(hub):
    hub.fail_next = 2  # the revision lookup gets 503 twice
    assert gguf_path(pull("--quant", "q8_0")).is_file()
    assert hub.fail_next == 0


def test_unreachable_hub_is_a_clear_error(hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: connection refused
    res = pull("--quant", "q8_0")
    assert res.exit_code == 1 and "cannot reach http://127.0.0.1:9" in res.output and "run again" in res.output


def test_cli_entry_point_shows_no_traceback(hub):
    p = subprocess.run([sys.executable, "-m", "deepseek_cpu", "pull", "nobody/nothing", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip() == "Error: nobody/nothing: repository not found on " + hub.url + \
        " (check the name; if it is private, pass --token or set HF_TOKEN)"


def _unloadable_gguf(path):
    """A well-formed GGUF that llama.cpp cannot load as a model (no known architecture)."""
    import gguf
    w = gguf.GGUFWriter(str(path), "no-such-arch")
    w.add_tensor("blk.0.attn_output.weight", np.zeros((64, 64), dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


def test_quantize_failure_is_a_clear_error(tmp_path):
    bad = _unloadable_gguf(tmp_path / "bad.gguf")
    with pytest.raises(hubmod.PullError, match=r"llama.cpp could not quantize bad.gguf with q4_k_m \(code \d+\): "
                                               r".*no-such-arch.*; try another"):
        hubmod.quantize(bad, tmp_path / "out.gguf", "q4_k_m", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf" * 10)
    with pytest.raises(hubmod.PullError, match=r"junk.gguf: not a readable GGUF \(GGUF magic invalid\)$"):
        hubmod.quantize(junk, tmp_path / "out.gguf", "q4_k_m", progress=False)


def test_unknown_quant_and_bad_repo_id():
    with pytest.raises(hubmod.PullError, match="unknown quantization scheme 'q9_z'; known schemes: f32, .*ds-q4"):
        hubmod.pull("a/b", quant="q9_z")
    with pytest.raises(hubmod.PullError, match="not a hub repo id"):
        hubmod.pull("just-a-name", quant="q8_0")


def test_pull_is_listed_as_a_builtin_plugin_command():
    res = CliRunner().invoke(cli, ["--help"])
    assert "pull" in res.output
    from deepseek_cpu.plugins import describe
    assert any(r["name"] == "deepseek_cpu.commands.pull" and "deepseek_cpu_register_commands" in r["hooks"] for r in describe())


# the hub package and each of its modules, found on disk: a module added later is covered too
HUB_MODULES = ["deepseek_cpu.hub"] + sorted(f"deepseek_cpu.hub.{m.name}" for m in pkgutil.iter_modules(hubmod.__path__))
# what the hub must not load at import time: runtime/llama.py (it imports the hub in from_hub; the
# other direction would be a cycle), runtime/llama_log.py and llama_cpp (the engine: `pull`'s start-up
# stays cheap, and the quantizer loads it when it runs)
_ENGINE = "sorted(m for m in sys.modules if m == 'llama_cpp' or m.startswith(('llama_cpp.', 'deepseek_cpu.runtime.llama')))"


@pytest.mark.parametrize("module", HUB_MODULES)
def test_each_hub_module_imports_alone_without_llama(module):
    r = run_python(f"import importlib, sys; importlib.import_module({module!r}); print({_ENGINE})")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", f"importing {module} loaded {r.stdout.strip()}"


def test_hub_public_names_stay_where_they_were():
    from deepseek_cpu.errors import DeepseekCpuError
    for name in ("pull", "PullError", "PullResult", "quantize", "estimate_disk", "free_bytes", "hf_endpoint",
                 "hf_cache_dir", "hf_offline", "gguf_cache_dir", "converter_key", "CONVERTER_FORMAT", "DIRECT",
                 "QUANTS", "INTERMEDIATE", "META_FILES", "INDEX", "RETRY_DELAYS"):
        assert hasattr(hubmod, name), name
    assert issubclass(hubmod.PullError, DeepseekCpuError)


def test_quantizer_loads_the_engine_and_log_callback_without_llama_py(tmp_path):
    """runtime/llama_log.py imports alone and installs the log callback; the hub's quantizer, run in a
    fresh interpreter, gets llama_cpp and that callback from it, never importing llama.py; and
    llama.py still offers the callback under its old names (the same objects)."""
    bad = _unloadable_gguf(tmp_path / "bad.gguf")
    r = run_python(
        "import sys\n"
        "import deepseek_cpu.runtime.llama_log as ll, llama_cpp._logger as lg\n"
        "assert lg.llama_log_callback is ll.safe_log_callback\n"
        "from deepseek_cpu.hub import PullError, quantize\n"
        "try:\n"
        f"    quantize({str(bad)!r}, {str(tmp_path / 'out.gguf')!r}, 'q4_k_m', progress=False)\n"
        "except PullError as e:\n"
        "    print('PullError:', e)\n"
        f"print({_ENGINE})\n"
        "import deepseek_cpu.runtime.llama as dl\n"
        "assert dl.safe_log_callback is ll.safe_log_callback and dl.install_log_callback is ll.install_log_callback\n")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("PullError: llama.cpp could not quantize bad.gguf with q4_k_m (code "), lines[0]
    assert "no message" not in lines[0]  # llama.cpp's own words reached the quantizer through the callback
    assert "'deepseek_cpu.runtime.llama'" not in lines[1] and "'llama_cpp'" in lines[1], lines[1]


def test_partial_file_hash_follows_a_restart(tmp_path):
    # http_get rewinds and truncates when a server answers a Range request with 200: the
    # running hash must then cover only the bytes written after the restart
    from deepseek_cpu.hub.download import _HashingWriter
    with open(tmp_path / "partial", "ab+") as f:
        f.write(b"kept part")
        w = _HashingWriter(f, hashlib.sha256)
        w.write(b" + more")
        assert w.hasher.hexdigest() == hashlib.sha256(b"kept part + more").hexdigest()
        w.seek(0)
        w.truncate()
        w.write(b"whole file")
        assert w.hasher.hexdigest() == hashlib.sha256(b"whole file").hexdigest()


def test_deepseek_v4_pulls_as_ds_v4_keeping_the_released_experts(tmp_path, monkeypatch, hub):
    """A V4 repo without --quant becomes ds-v4: the experts DeepSeek released in MXFP4 are copied
    (not re-quantized); a scheme that would re-quantize them is refused before any weight is fetched."""
    import gguf
    repo = "deepseek-ai/tiny-v4-flash"
    srv = HubServer({repo: make_repo(tmp_path / "v4repo", fixture="v4_flash")}, lifetime=300).start()
    monkeypatch.setenv("HF_ENDPOINT", srv.url)
    try:
        res = CliRunner().invoke(cli, ["pull", repo, "--quiet", "--quant", "q4_k_m"])
        assert res.exit_code != 0 and "--quant ds-v4" in res.output and "Traceback" not in res.output
        assert not weight_requests(srv)
        res = CliRunner().invoke(cli, ["pull", repo, "--quiet"])
        path = gguf_path(res)
        assert path.name.endswith("ds-v4.gguf"), path
        t = {x.name: x for x in gguf.GGUFReader(path).tensors}
        assert t["blk.1.ffn_gate_exps.weight"].tensor_type == gguf.GGMLQuantizationType.MXFP4
        assert t["blk.0.ffn_gate_tid2eid.weight"].tensor_type == gguf.GGMLQuantizationType.I32
    finally:
        srv.stop()
