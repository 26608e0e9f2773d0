"""`deepseek-cpu demo`: convert and run the embedded tiny DeepSeek-V2 checkpoint, checked
against transformers' logits, so a fresh install proves itself end to end."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

# package data (also the test suite's `v2_group` fixture: tests/fixture_paths.py)
DATA = Path(__file__).parent.parent / "data" / "tiny-deepseek-v2"
TOLERANCE = 1e-4


def run_demo(echo=print) -> float:
    from ..conversion.convert import convert
    from ..runtime.engine import require_patched
    from ..runtime.llama import Llama

    echo(f"engine: {require_patched()}")
    ckpt = DATA
    ref = np.load(ckpt / "reference.npz")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        gguf = convert(ckpt, Path(tmp) / "tiny-deepseek-v2.gguf", outtype="f32", progress=False)
        echo(f"converted {ckpt.name} (DeepSeek-V2, group-limited routing, YaRN) in {time.time() - t0:.2f} s")
        llm = Llama(str(gguf), n_ctx=256, logits_all=True, type_k=0, type_v=0, verbose=False)
        tokens = [int(t) for t in ref["tokens"]]
        llm.eval(tokens)
        got = np.array(llm.scores[: len(tokens)])
        err = float((np.abs(got - ref["logits"]).max(1) / np.abs(ref["logits"]).max(1)).max())
        echo(f"logits vs transformers over {len(tokens)} positions: max relative error {err:.2e} "
             f"({'OK' if err <= TOLERANCE else 'FAIL'}, bound {TOLERANCE:g})")
        llm.reset()
        out = llm.create_completion(str(ref["prompt"]) if "prompt" in ref.files else "Hello", max_tokens=16, temperature=0)
        echo(f"greedy continuation (random weights, so not meaningful text): {out['choices'][0]['text']!r}")
        llm.close()
    return err
