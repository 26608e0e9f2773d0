"""`deepseek-cpu eval`: how far a quantized model is from its reference, on a text.

    deepseek-cpu eval model-q4_k_m.gguf --ref model-bf16.gguf --text wiki.test.raw

The numbers are those of llama.cpp's `llama-perplexity --kl-divergence`, computed the way
it computes them (tools/perplexity/perplexity.cpp, perplexity() and kl_divergence()):
  * the text: the file's bytes less one trailing newline, tokenized once by the reference
    with the BOS token if the vocabulary adds one (no parsing of special tokens);
  * chunks: consecutive, non-overlapping runs of n_ctx tokens (a tail shorter than n_ctx is
    dropped); each is evaluated from an empty KV cache, its first token replaced by BOS
    (when the vocabulary adds one), in one batch of n_ctx tokens;
  * scored tokens: only the second half of each chunk, so every prediction has at least
    n_ctx/2 tokens of context: the logits at positions n_ctx/2 .. n_ctx-2 predict tokens
    n_ctx/2+1 .. n_ctx-1, i.e. n_ctx - 1 - n_ctx/2 tokens per chunk; PPL, KLD, top-1 and
    Δp are all averaged over exactly these tokens;
  * KLD(ref || model) per token = sum_v p_ref(v) * (log p_ref(v) - log p_model(v));
    Δp = p_model(next token) - p_ref(next token); RMS Δp = sqrt(mean Δp²);
    same top = share of tokens whose argmax (first maximum) is the same in both;
  * percentiles: linear interpolation between sorted values at fraction * (n - 1);
  * ± values: the standard error of a mean, sqrt((E[x²] - E[x]²) / (n - 1)) (0 when
    n <= 10), carried through exp() for PPL, through sqrt() for RMS Δp, binomial for
    the top-1 share, and with the covariance of the two models' log-likelihoods for the
    PPL ratio.

One difference, on purpose: llama-perplexity stores the reference's log-probabilities as
16-bit integers (scale = (max - min) / 65535 over a window of 16 nats, everything below
dropped), so its reference numbers carry that rounding; here both distributions are the
engine's float32 logits, log-softmaxed in float64. Its results agree with ours to its
printed precision (tests/test_evaluate.py checks it against the program).

Both models are loaded at once and each chunk is evaluated by both before the next:
only one chunk of logits per model is ever held (llama-perplexity writes the reference's
log-probabilities of the whole text to a file instead). Both must fit in memory together.
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import DeepseekCpuError

DEFAULT_CTX = 512  # llama-perplexity's default -c
MIN_CTX = 4        # below this the scored half of a chunk is empty or a single token
# Scored rows are log-softmaxed this many at a time: float64 rows of a 100k-token vocabulary
# are 0.8 MB each, and a whole 512-token chunk's half would be ~200 MB per temporary array.
ROWS_PER_BLOCK = 32


class EvalError(DeepseekCpuError, ValueError):
    """The inputs of an evaluation cannot be compared (vocabularies, text length, context)."""


class EvalFileNotFound(EvalError, FileNotFoundError):
    """A model or text file given to the evaluation does not exist."""


@dataclass
class EvalResult:
    model: str
    reference: str
    text: str
    n_ctx: int
    n_chunks: int
    n_text_tokens: int
    n_scored: int               # tokens every statistic below is averaged over
    ppl_model: float
    ppl_model_err: float
    ppl_ref: float
    ppl_ref_err: float
    ppl_ratio: float            # PPL(model) / PPL(ref)
    ppl_ratio_err: float
    ln_ppl_ratio: float         # mean over tokens of nll_model - nll_ref
    ln_ppl_ratio_err: float
    kld_mean: float
    kld_mean_err: float
    kld_median: float
    kld_p99: float
    kld_max: float
    same_top: float             # fraction in [0, 1]
    same_top_err: float
    rms_dp: float               # probability (not percent)
    rms_dp_err: float

    def to_dict(self) -> dict:
        return asdict(self)


# --- statistics, as perplexity.cpp computes them ---------------------------------------

def _mean_and_err(total: float, total_sq: float, count: int) -> tuple[float, float]:
    # perplexity.cpp's mean_and_uncertainty: no error estimate from 10 values or fewer
    mean = total / count
    var = total_sq / count - mean * mean
    return mean, (var / (count - 1)) ** 0.5 if var > 0 and count > 10 else 0.0


def _percentile(sorted_values, fraction: float) -> float:
    # perplexity.cpp's percentile(): linear between the two values around fraction*(n-1)
    pos = fraction * (len(sorted_values) - 1)
    i = int(pos)
    frac = pos - i
    return float((1 - frac) * sorted_values[i] + frac * sorted_values[min(i + 1, len(sorted_values) - 1)])


def _log_softmax(logits):
    import numpy as np
    x = logits.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    return x


class _Totals:
    """Running sums over scored tokens, plus the per-token KLD and Δp for the percentiles
    (two floats per token: the only thing kept from chunk to chunk)."""

    def __init__(self):
        self.count = 0
        self.nll = self.nll_sq = self.nll_ref = self.nll_ref_sq = self.nll_cross = 0.0
        self.kld = self.kld_sq = self.dp_sq = self.dp_4 = 0.0
        self.same_top = 0
        self.kld_values: list = []
        self.dp_values: list = []

    def add(self, ref_logits, model_logits, targets) -> None:
        """Rows of logits (float32, [n, vocab]) predicting `targets` ([n] token ids)."""
        import numpy as np
        for s in range(0, len(targets), ROWS_PER_BLOCK):
            ref_lp = _log_softmax(ref_logits[s:s + ROWS_PER_BLOCK])
            model_lp = _log_softmax(model_logits[s:s + ROWS_PER_BLOCK])
            tgt = np.asarray(targets[s:s + ROWS_PER_BLOCK])
            rows = np.arange(len(tgt))
            nll_ref = -ref_lp[rows, tgt]
            nll = -model_lp[rows, tgt]
            kld = (np.exp(ref_lp) * (ref_lp - model_lp)).sum(axis=1)
            dp = np.exp(-nll) - np.exp(-nll_ref)
            self.count += len(tgt)
            self.nll += nll.sum()
            self.nll_sq += (nll * nll).sum()
            self.nll_ref += nll_ref.sum()
            self.nll_ref_sq += (nll_ref * nll_ref).sum()
            self.nll_cross += (nll * nll_ref).sum()
            self.kld += kld.sum()
            self.kld_sq += (kld * kld).sum()
            self.dp_sq += (dp * dp).sum()
            self.dp_4 += (dp ** 4).sum()
            # argmax of the raw logits: the first maximum, as perplexity.cpp's strict `>` picks
            self.same_top += int((ref_logits[s:s + ROWS_PER_BLOCK].argmax(axis=1)
                                  == model_logits[s:s + ROWS_PER_BLOCK].argmax(axis=1)).sum())
            self.kld_values.append(kld)
            self.dp_values.append(dp)

    def running(self) -> dict:
        """What the progress bar shows after each chunk."""
        import math
        return {"ppl": f"{math.exp(self.nll / self.count):.4g}", "kld": f"{self.kld / self.count:.4g}"}

    def result(self, **about) -> EvalResult:
        import math

        import numpy as np
        n = self.count
        ln_ppl, ln_ppl_err = _mean_and_err(self.nll, self.nll_sq, n)
        ln_ref, ln_ref_err = _mean_and_err(self.nll_ref, self.nll_ref_sq, n)
        # covariance of the two means (perplexity.cpp's covariance(): 0 below 10 tokens)
        cov = (self.nll_cross / n - ln_ppl * ln_ref) / (n - 1) if n >= 10 else 0.0
        ln_ratio = ln_ppl - ln_ref
        ln_ratio_err = math.sqrt(max(ln_ppl_err ** 2 + ln_ref_err ** 2 - 2 * cov, 0.0))
        kld_mean, kld_err = _mean_and_err(self.kld, self.kld_sq, n)
        mse_dp, mse_dp_err = _mean_and_err(self.dp_sq, self.dp_4, n)
        rms_dp = math.sqrt(mse_dp)
        same_top = self.same_top / n
        kld_sorted = np.sort(np.concatenate(self.kld_values))
        return EvalResult(
            **about, n_scored=n,
            ppl_model=math.exp(ln_ppl), ppl_model_err=math.exp(ln_ppl) * ln_ppl_err,
            ppl_ref=math.exp(ln_ref), ppl_ref_err=math.exp(ln_ref) * ln_ref_err,
            ppl_ratio=math.exp(ln_ratio), ppl_ratio_err=math.exp(ln_ratio) * ln_ratio_err,
            ln_ppl_ratio=ln_ratio, ln_ppl_ratio_err=ln_ratio_err,
            kld_mean=kld_mean, kld_mean_err=kld_err,
            kld_median=float(np.median(kld_sorted)), kld_p99=_percentile(kld_sorted, 0.99),
            kld_max=float(kld_sorted[-1]),
            same_top=same_top, same_top_err=math.sqrt(same_top * (1 - same_top) / (n - 1)) if n > 1 else 0.0,
            rms_dp=rms_dp, rms_dp_err=0.5 / rms_dp * mse_dp_err if rms_dp > 0 else 0.0,
        )


# --- the evaluation ---------------------------------------------------------------------

def _existing(path, what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise EvalFileNotFound(f"{what} {p}: no such file")
    return p


def read_text(path) -> bytes:
    """The text as llama-perplexity's -f reads it: raw bytes, one trailing newline dropped."""
    data = _existing(path, "text").read_bytes()
    return data[:-1] if data.endswith(b"\n") else data


def _open(path: Path, n_ctx: int, threads: int):
    from ..runtime.llama import Llama
    try:
        # logits_all: llama-cpp-python copies each batch's logits into `scores` only then;
        # n_batch = n_ubatch = n_ctx: one chunk is one batch, as llama-perplexity -b/-ub n_ctx
        return Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                     n_threads=threads, n_threads_batch=threads, verbose=False)
    except ValueError as e:  # llama-cpp-python: "Failed to load model from file: ..."
        raise EvalError(f"{path}: llama.cpp could not load it ({e})") from None


def default_ctx(*paths) -> int:
    """llama-perplexity's 512, or the shortest training context of the models if smaller."""
    from ..runtime.llama import read_shape
    shapes = [read_shape(str(p)) for p in paths]
    return min([DEFAULT_CTX] + [s.n_ctx_train for s in shapes if s is not None and s.n_ctx_train > 0])


def evaluate(model, ref, text, n_ctx: int | None = None, max_chunks: int | None = None,
             threads: int | None = None, progress: bool = True) -> EvalResult:
    """PPL of `model` and `ref` (GGUF paths) on the `text` file, and the KL divergence, top-1
    agreement and RMS Δp of `model` against `ref` (see the module docstring for how)."""
    import numpy as np
    from tqdm import tqdm

    from ..runtime.resources import default_threads
    model, ref = _existing(model, "model"), _existing(ref, "reference")
    data = read_text(text)
    n_ctx = n_ctx or default_ctx(model, ref)
    if n_ctx < MIN_CTX:
        raise EvalError(f"--ctx {n_ctx}: at least {MIN_CTX} tokens per chunk are needed")
    if max_chunks is not None and max_chunks < 1:
        raise EvalError(f"--chunks {max_chunks}: at least one chunk is needed")
    threads = threads or default_threads()

    ref_llm = _open(ref, n_ctx, threads)
    # the reference tokenizes, as llama-perplexity's first pass (with the reference) does
    tokens = ref_llm.tokenize(data, add_bos=True, special=False)
    if len(tokens) < n_ctx:
        raise EvalError(f"{text}: {len(tokens)} tokens, too short for one chunk of {n_ctx}: "
                        f"at least {n_ctx} tokens are needed (a longer text, or a smaller --ctx)")
    model_llm = _open(model, n_ctx, threads)
    if model_llm.n_vocab() != ref_llm.n_vocab():
        raise EvalError(f"the vocabularies differ: {model} has {model_llm.n_vocab()} tokens, "
                        f"the reference {ref} has {ref_llm.n_vocab()}; compare models of the same tokenizer")

    bos = ref_llm.token_bos() if ref_llm._model.add_bos_token() else None
    n_chunks = len(tokens) // n_ctx
    if max_chunks is not None:
        n_chunks = min(n_chunks, max_chunks)
    first = n_ctx // 2
    totals = _Totals()
    bar = tqdm(total=n_chunks, unit="chunk", desc=f"eval {model.name}", file=sys.stderr, disable=not progress,
               leave=False)
    try:
        for c in range(n_chunks):
            chunk = tokens[c * n_ctx:(c + 1) * n_ctx]
            targets = chunk[first + 1:]  # read before the BOS replacement, which only touches [0]
            if bos is not None:
                chunk = [bos] + chunk[1:]
            logits = []
            for llm in (ref_llm, model_llm):
                llm.reset()  # the next eval removes the whole KV cache from position 0
                llm.eval(chunk)
                logits.append(llm.scores[first:n_ctx - 1])
            totals.add(logits[0], logits[1], np.asarray(targets))
            bar.update()
            bar.set_postfix(totals.running(), refresh=False)
    finally:
        bar.close()
    return totals.result(model=str(model), reference=str(ref), text=str(text), n_ctx=n_ctx,
                         n_chunks=n_chunks, n_text_tokens=len(tokens))


# --- reporting --------------------------------------------------------------------------

def format_table(r: EvalResult) -> str:
    rows = [
        ("PPL(model)", f"{r.ppl_model:.4f}", f"{r.ppl_model_err:.4f}"),
        ("PPL(ref)", f"{r.ppl_ref:.4f}", f"{r.ppl_ref_err:.4f}"),
        ("PPL(model)/PPL(ref)", f"{r.ppl_ratio:.6f}", f"{r.ppl_ratio_err:.6f}"),
        ("mean KLD", f"{r.kld_mean:.6f}", f"{r.kld_mean_err:.6f}"),
        ("median KLD", f"{r.kld_median:.6f}", ""),
        ("99% KLD", f"{r.kld_p99:.6f}", ""),
        ("max KLD", f"{r.kld_max:.6f}", ""),
        ("same top token", f"{100 * r.same_top:.3f} %", f"{100 * r.same_top_err:.3f} %"),
        ("RMS Δp", f"{100 * r.rms_dp:.3f} %", f"{100 * r.rms_dp_err:.3f} %"),
    ]
    w0, w1 = max(len(a) for a, _, _ in rows), max(len(b) for _, b, _ in rows)
    head = (f"{Path(r.model).name} against {Path(r.reference).name} on {Path(r.text).name}: "
            f"{r.n_chunks} chunks of {r.n_ctx} tokens, {r.n_scored} tokens scored")
    return "\n".join([head] + [f"{a.ljust(w0)}  {b.rjust(w1)}" + (f" ± {c}" if c else "") for a, b, c in rows])
