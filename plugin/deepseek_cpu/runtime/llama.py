"""`deepseek_cpu.Llama`: llama_cpp.Llama with CPU defaults chosen for DeepSeek models.

Same signature as llama_cpp.Llama; only arguments the caller leaves out get our
defaults:
  - n_threads / n_threads_batch: physical cores of this process (affinity, cgroup quota)
  - n_ctx: the largest context (up to the model's own, at most 32768) whose KV cache fits
    in a quarter of the memory left after the weights, instead of llama-cpp-python's 512
    or the 163840-token training length that runs machines out of memory
  - flash_attn: off; on CPU it costs accuracy (~2% on logits) for a speed gain we have
    not yet measured on our build

Behaviour fixes over llama_cpp.Llama (see docs/integrations.md):
  - generation that reaches n_ctx ends with finish_reason="length" instead of raising
    `RuntimeError: llama_decode returned 1` (streaming or not, completion or chat)
  - tools, tool_choice and JSON-schema response_format on DeepSeek-V2.5/V3/R1 templates answer
    as `deepseek-cpu serve` does, in DeepSeek's tool-call markup (runtime/tool_calls.py); on
    V3.1/V3.2/V4 templates so does every chat request, thinking per request (runtime/hybrid_chat.py)
  - importing this module installs a log callback that cannot raise on a log line cut
    inside a multi-byte character (the stock one sprays UnicodeDecodeError tracebacks)
"""
from __future__ import annotations

import inspect
import os

import numpy as np

from .. import _dropin
from ..quantization import types as quant_types
from . import memory_budget, resources

_dropin.activate()

import llama_cpp  # noqa: E402  (after the drop-in has chosen the library)

# The log callback lives in llama_log.py, which the hub's quantizer imports too (so the hub
# needs nothing from this module); importing it installs the callback. Re-exported here,
# where it has always been found.
from .llama_log import _log_write, install_log_callback, safe_log_callback  # noqa: E402, F401

# sizing a context from the file's header: runtime/model_file.py (light: no libllama), where
# `serve` reads it too; the names stay importable from here
from .model_file import MAX_DEFAULT_CTX, MIN_DEFAULT_CTX, ModelShape, default_n_ctx, read_shape  # noqa: E402, F401


def cpu_defaults(model_path: str, given: dict, header=None) -> dict:
    out = {}
    if given.get("n_threads") is None:
        out["n_threads"] = resources.default_threads()
    if given.get("n_threads_batch") is None:
        out["n_threads_batch"] = given.get("n_threads") or out.get("n_threads")
    if "n_ctx" not in given:
        out["n_ctx"] = default_n_ctx(read_shape(model_path, header))
    if "flash_attn" not in given:
        out["flash_attn"] = False
    return out


def _checked_header(model_path, mtp: bool):
    """The file's GGUF header, checked for what the engine would abort on (runtime/model_check.py:
    a MalformedModel naming the tensor or key); None when this reader cannot read it, so that the
    engine's loader, which reads it anyway, gives its own error as it always has."""
    from ..gguf_header import read
    from .model_check import check
    try:
        header = read(model_path)
    except (OSError, ValueError):
        return None
    check(header, mtp)
    return header


# --- context limit --------------------------------------------------------------------------
_COMPLETION_SIG = inspect.signature(llama_cpp.Llama.create_completion)


class _ContextFull:
    """Stopping criterion: the next token would not fit in the KV cache.

    llama-cpp-python caps max_tokens at n_ctx - prompt, but its loop skips that check while
    it holds back an incomplete UTF-8 sequence, and then evaluates past n_ctx (llama_decode
    returns 1, "failed to find a memory slot"). Stopping here ends the generator cleanly."""

    def __init__(self, n_ctx: int):
        self.n_ctx = n_ctx
        self.fired = False

    def __call__(self, input_ids, logits) -> bool:
        if len(input_ids) >= self.n_ctx:
            self.fired = True
        return self.fired


def _as_length(chunk: dict) -> dict:
    for c in chunk.get("choices", ()):
        if c.get("finish_reason") == "stop":
            c["finish_reason"] = "length"
    return chunk


class Llama(llama_cpp.Llama):
    __doc__ = (llama_cpp.Llama.__doc__ or "") + "\n\n" + (__doc__ or "")

    def __init__(self, model_path: str, *args, mtp: bool | int = False, repack_cache=None, **kwargs):
        """mtp: draft with the model's own multi-token-prediction head (DeepSeek-V3/R1/V3.1/V3.2):
        True or a number of draft tokens (1..3) per step, verified by the model in one batch
        (runtime/mtp.py). Same tokens as without it, greedy or sampled alike; a model without an
        MTP layer says so in one line and decodes as usual. `self.mtp_stats` counts drafts and
        kept tokens.

        repack_cache: True (the default directory, <cache root>/repack) or a directory: the first
        load writes the repacked weights there, later loads map them instead of repacking (fast
        loads for one more file the size of the weights; runtime/repack_cache.py). False: off.
        Default: DEEPSEEK_CPU_REPACK_CACHE's directory if set, else off."""
        from . import model_params
        from .repack_cache import ENV, directory
        with model_params.environment(ENV, directory(repack_cache)):
            self._load(model_path, *args, mtp=mtp, **kwargs)

    def _load(self, model_path: str, *args, mtp: bool | int = False, **kwargs):
        from . import mtp as mtp_mod
        n_draft = mtp_mod.parse_draft(mtp)
        self._mtp = None
        if n_draft and kwargs.get("draft_model") is not None:
            raise ValueError("mtp and draft_model are two draft models: pass one")
        # one reading of the header for everything below (a real model's has a 100k-token
        # vocabulary to walk), checked first: the engine aborts on some malformed files
        header = _checked_header(model_path, bool(n_draft))
        if not n_draft:
            self._init(model_path, *args, _header=header, **kwargs)
            return
        from . import model_params
        with model_params.with_mtp(), model_params.rollback_snapshots(n_draft):
            self._init(model_path, *args, _header=header, **kwargs)
        if header is None:  # unreadable here, yet the engine loaded it: read as before, errors and all
            from ..gguf_header import read
            header = read(model_path)
        reason = mtp_mod.unavailable_reason(header)
        if reason:
            mtp_mod.warn(reason)
            return
        from .mtp_draft import MtpDraft
        self._mtp = MtpDraft(self, n_draft, header)
        self.draft_model = self._mtp
        self._stack.callback(self._mtp.close)  # before the model is freed (the stack is LIFO)

    @property
    def mtp_stats(self):
        """MTP draft counters (runtime/mtp.py MtpStats), None without MTP."""
        return self._mtp.stats if self._mtp is not None else None

    def _init(self, model_path: str, *args, mem_budget: str | int | None = None, prefetch: str | None = None,
              rpc_servers: str | list[str] | None = None, rpc_local: str | int | None = None,
              rpc_key: str | bytes | None = None, rpc_key_file: str | os.PathLike | None = None, _header=None,
              **kwargs):
        """mem_budget: run within this much memory ("4G"): the routed experts are used from the
        file mapping instead of being copied, what every token reads is copied as usual, and a
        prefetch policy (`prefetch`, default "popular") reads the popular experts ahead
        (runtime/memory_budget.py, runtime/prefetch.py). None: everything copied into memory
        (fastest when the model fits).

        rpc_servers: "host:port,..." of `deepseek-cpu rpc-worker`s: the layers are split over
        them by the memory each offers (rpc_local: how much this process takes, default none
        but the embeddings), printed, and computed there (runtime/rpc.py). A worker lost while
        the model runs raises RpcWorkerLost within DEEPSEEK_CPU_RPC_TIMEOUT seconds. rpc_key (or
        rpc_key_file, a file only you may read): the workers' shared key (`rpc-worker --key-file`),
        proved to them and by them before anything is sent; default: DEEPSEEK_CPU_RPC_KEY_FILE's."""
        # _header: the file's GGUF header as __init__ read and checked it (None if unreadable)
        if rpc_servers is None and (rpc_key is not None or rpc_key_file is not None):
            raise ValueError("rpc_key and rpc_key_file go with rpc_servers")
        if rpc_servers is not None:
            if mem_budget is not None:
                from .rpc import RpcError
                raise RpcError("rpc_servers and mem_budget cannot be combined (the workers hold the layers in memory)")
            from . import rpc
            from ..gguf_header import read
            header = _header or read(model_path)  # once, for everything below
            if not args:
                kwargs = {**cpu_defaults(model_path, {**kwargs, "n_ctx": kwargs.get("n_ctx", rpc.DEFAULT_CTX)}, header),
                          **kwargs}
            load = rpc.prepare(model_path, rpc_servers, rpc_local, kwargs, kwargs.get("verbose", True), header,
                               rpc_key, rpc_key_file)
            self.rpc_split = load.split
            self._rpc_losses = rpc.losses()[0]
            self._rpc_load = load  # holds the device and override arrays the model's params point to
            with load.params:
                super().__init__(model_path, *args, **kwargs)
            return
        budget, header = None, _header
        if mem_budget is not None:
            size = memory_budget.parse_size(mem_budget)
            if kwargs.get("use_mmap") is False:
                raise memory_budget.MemoryBudgetError("mem_budget runs the weights from the file mapping: "
                                                      "it cannot be combined with use_mmap=False")
            header = header or memory_budget.read_header(model_path)  # once, for everything below
            shape = read_shape(model_path, header)
            if "n_ctx" not in kwargs and not args:
                hot, _ = memory_budget.tensor_bytes(model_path, header)
                kwargs["n_ctx"] = default_n_ctx(shape, available=size, weights=hot)
            n_ctx = kwargs.get("n_ctx") or 512
            budget = memory_budget.plan(model_path, size, (shape.kv_bytes_per_token if shape else 0) * n_ctx, header)
        if not args:
            kwargs = {**cpu_defaults(model_path, kwargs, header), **kwargs}
        if budget is None:
            super().__init__(model_path, *args, **kwargs)
        else:
            self.memory_plan = budget
            from . import experts, model_params
            with model_params.mapped(memory_budget.EXPERT_TENSORS.pattern):
                super().__init__(model_path, *args, **kwargs)
            experts.forget_expert_addresses()  # another model's, possibly freed
            # the engine reads the chosen experts' pages ahead as soon as each layer's router has
            # chosen (dsc/expert-prefetch.c): for this process, unless DEEPSEEK_CPU_EXPERT_PREFETCH
            # says otherwise
            if not os.environ.get("DEEPSEEK_CPU_EXPERT_PREFETCH"):
                experts.set_expert_prefetch(0 if prefetch == "none" else memory_budget.EXPERT_PREFETCH_LEVEL)
            self._prefetch(model_path, budget, prefetch, kwargs.get("verbose", True), header)

    def eval(self, tokens):
        """llama_cpp.Llama.eval; over RPC workers, a lost worker is an RpcWorkerLost, not garbage
        or a bare `llama_decode returned -3`."""
        if getattr(self, "rpc_split", None) is None:
            return self._eval(tokens)
        from . import rpc
        try:
            self._eval(tokens)
            # llama-cpp-python reads no logits here unless logits_all: wait for the workers, as a
            # CPU backend would have, so that a loss shows up at this token and timings are real
            llama_cpp.llama_synchronize(self._ctx.ctx)
        except RuntimeError:
            rpc.check(self._rpc_losses)
            raise
        rpc.check(self._rpc_losses)

    def _eval(self, tokens):
        """llama_cpp.Llama.eval, and with MTP: a draft's batch computes logits at every row (the
        sampler checks each draft; llama-cpp-python would otherwise keep logits for every token
        of the context, n_ctx x n_vocab floats), and every batch's hidden states go to the head."""
        d = self._mtp
        if d is None:
            return super().eval(tokens)
        verify = d.is_verify(tokens, self.n_tokens)
        # sequence 0 by its id: a cache that rolls back by snapshots (V4's) refuses "all sequences"
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._ctx.ctx), 0, self.n_tokens, -1)
        for i in range(0, len(tokens), self.n_batch):
            chunk = tokens[i:i + self.n_batch]
            n_past, n = self.n_tokens, len(chunk)
            self._batch.set_batch(batch=chunk, n_past=n_past, logits_all=verify or self._logits_all)
            self._ctx.decode(self._batch)
            self.input_ids[n_past:n_past + n] = chunk
            if self._logits_all:
                logits = np.ctypeslib.as_array(self._ctx.get_logits(), shape=(n * self._n_vocab,))
                self.scores[n_past:n_past + n, :].reshape(-1)[::] = logits
            self.n_tokens += n
            d.target_batch(n_past, n, verify)
        self._requires_eval = False

    def create_completion(self, *args, **kwargs):
        """llama_cpp.Llama.create_completion; reaching n_ctx ends with finish_reason="length"."""
        bound = _COMPLETION_SIG.bind(self, *args, **kwargs)
        full = _ContextFull(self._n_ctx)
        given = bound.arguments.get("stopping_criteria")
        bound.arguments["stopping_criteria"] = llama_cpp.StoppingCriteriaList([full, *(given or [])])
        result = super().create_completion(*bound.args[1:], **bound.kwargs)
        if bound.arguments.get("stream"):
            return self._stream_length(result, full)
        return _as_length(result) if full.fired else result

    def _prefetch(self, model_path, budget, policy, verbose, header):
        import atexit
        import weakref
        from . import prefetch
        self.memory_layout = prefetch.layout(model_path, header)
        prefetch.register_experts(self.memory_layout, budget.experts_per_token)
        self.memory_placement, self.memory_applied, name = prefetch.run_policy(policy, self.memory_layout, budget)
        if verbose:
            import sys
            a = self.memory_applied
            size = memory_budget.format_size
            print(f"deepseek-cpu: {budget.describe()}; prefetch {name}: locked {size(a.locked)}, "
                  f"read ahead {size(a.warmed)}", file=sys.stderr)
        ref = weakref.ref(self)
        atexit.register(lambda: ref() is not None and ref().close())

    def close(self):
        """llama_cpp.Llama.close; under a budget, first adds this run's routings to the model's
        statistics (once); for any model, makes the engine's read-ahead forget the addresses it learnt
        (they point into this model)."""
        if getattr(self, "memory_layout", None) is not None and not getattr(self, "_usage_saved", False):
            self._usage_saved = True
            try:
                self.save_expert_usage()
            except Exception as e:  # statistics are a hint: never fail a close over them
                import warnings
                warnings.warn(f"could not save expert statistics: {e}", stacklevel=2)
        if getattr(self, "_model", None) is not None:  # any model: the read-ahead may have learnt it
            try:
                from . import experts
                experts.forget_expert_addresses()
            except Exception:  # another engine (stock, in a benchmark), or the interpreter exiting
                pass
        super().close()

    def save_expert_usage(self):
        """Add the routings counted so far to this model's statistics sidecar (used by the
        prefetch policy at the next start under a budget); returns its path, or None."""
        from . import prefetch
        layout = getattr(self, "memory_layout", None) or prefetch.layout(self.model_path)
        try:
            usage = self.expert_usage()
        except Exception:
            return None
        if usage.routings == 0:
            return None
        return prefetch.save_counts(layout, {layer: usage.counts[i] for i, layer in enumerate(usage.layers)})

    def __del__(self):
        # an __init__ that raised before llama_cpp.Llama.__init__ ran (a bad budget) leaves
        # nothing to close; llama_cpp's __del__ would print an AttributeError
        if "_stack" in self.__dict__:
            super().__del__()

    def create_chat_completion(self, messages, *args, **kwargs):
        """llama_cpp.Llama.create_chat_completion. For DeepSeek-V3.1, V3.2 and V4 templates every
        request goes through runtime/hybrid_chat.py (thinking per request with
        `chat_template_kwargs={"thinking": True}` or `reasoning_effort`, thoughts in
        `reasoning_content`, tool calls and JSON-schema replies in the template's own markup); for a
        template in DeepSeek's V2.5/V3/R1 tool-call markup, requests with `tools` or a JSON-schema
        `response_format` go through runtime/tool_calls.py; both answer as `deepseek-cpu serve`
        does. Everything else, and every other model, is llama-cpp-python's own handler."""
        from . import hybrid_chat, tool_calls
        own = not args and self.chat_handler is None and "functions" not in kwargs \
            and self.chat_format in (None, "chat_template.default")
        template = self.metadata.get("tokenizer.chat_template")
        if own and hybrid_chat.template_kind(template):
            return hybrid_chat.chat_completion(self, messages, **kwargs)
        # the thinking fields llama_cpp.Llama does not take: a thought asked from a template
        # without a thinking mode is refused as the server refuses it; otherwise the template's own
        hybrid_chat.thinking_variables(template, kwargs.pop("chat_template_kwargs", None),
                                       kwargs.pop("reasoning_effort", None))
        for k in ("thinking_budget_tokens", "reasoning_budget_tokens"):
            kwargs.pop(k, None)
        wants = kwargs.get("tools") or (kwargs.get("response_format") or {}).get("type") in ("json_schema", "json_object")
        if own and wants and tool_calls.is_deepseek_tool_template(template):
            return tool_calls.chat_completion(self, messages, **kwargs)
        return super().create_chat_completion(messages, *args, **kwargs)

    def expert_usage(self):
        """How often the router chose each routed expert of this model (runtime/experts.py):
        an ExpertUsage over the MoE layers. The engine's counters are per process; call
        reset_expert_usage() first to count one text."""
        from .experts import usage_for
        return usage_for(self.metadata)

    @staticmethod
    def reset_expert_usage() -> None:
        """Zero the engine's expert-usage counters (they are per process)."""
        from .experts import reset_expert_usage
        reset_expert_usage()

    @staticmethod
    def _stream_length(chunks, full: _ContextFull):
        for chunk in chunks:
            yield _as_length(chunk) if full.fired else chunk

    @classmethod
    def from_hub(cls, repo_id: str, quant: str | None = None, revision: str | None = None, *,
                 token: str | None = None, cache_dir: str | None = None, output_dir: str | None = None,
                 delete_snapshot: bool = False, progress: bool = True, **kwargs) -> "Llama":
        """Pull a safetensors checkpoint from the Hugging Face hub (download, convert, quantize,
        cached; see deepseek_cpu.hub.pull) and load it; `kwargs` go to Llama().
        Unlike llama_cpp.Llama.from_pretrained, the repo holds the original weights, not a GGUF."""
        # imported here: the hub (huggingface_hub, the converter) is only needed for from_hub,
        # and only this direction exists (the hub never imports this module)
        from ..hub import pull
        res = pull(repo_id, quant=quant, revision=revision, token=token, cache_dir=cache_dir,
                   output_dir=output_dir, delete_snapshot=delete_snapshot, progress=progress)
        return cls(str(res.path), **kwargs)


def open_for_terminal(model: str, threads: int | None = None, n_ctx: int | None = None,
                      mem_budget: str | None = None, prefetch: str | None = None, mtp: int = 0,
                      repack_cache: str | None = None) -> "Llama":
    """The model as `run` and `chat` open it: quiet, our defaults unless given."""
    kw: dict = {"verbose": False, "mtp": mtp, "repack_cache": repack_cache}
    if mem_budget:
        kw.update(mem_budget=mem_budget, prefetch=prefetch)
    if threads:
        kw["n_threads"] = threads
    if n_ctx:
        kw["n_ctx"] = n_ctx
    return Llama(model, **kw)
