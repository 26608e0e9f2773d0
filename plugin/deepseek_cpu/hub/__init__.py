"""From a Hugging Face hub repo to a ready GGUF: download, convert, quantize, cache.

    from deepseek_cpu.hub import pull
    path = pull("deepseek-ai/DeepSeek-V2-Lite-Chat", quant="q4_k_m").path

Steps, each stopping with a one-line `PullError` saying what went wrong and what to do:

1. Resolve the revision to a commit sha (offline: from the local refs). If a GGUF for
   (repo, sha, quant, converter version) is cached, return it at once.
2. Pre-flight: fetch config.json alone and refuse architectures no converter handles;
   list the repo and pick what the converter reads (config, tokenizer files, the
   safetensors shards named by the index; never *.bin, *.pt, optimizer states or other
   formats); check free disk for download + conversion + output.
3. Download those files (revision pinned to the sha; token / HF_TOKEN, HF_ENDPOINT,
   HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE honoured, read at call time). Each file goes
   to a stable partial name in the HF cache (download.py), so a run that is killed or
   loses the network halfway through a shard continues it next time with a Range
   request; finished files are checked (size, sha256 of LFS files) before they count.
   Network errors are retried with backoff. `snapshot_download` then links the files
   into the standard snapshot layout (and is all that runs offline).
4. Convert (f32 / f16 / bf16 / q8_0 directly; other types through a bf16 intermediate
   quantized by llama.cpp's `llama_model_quantize`; quantization/types.py says which is which),
   written to a temporary name and renamed, so an interrupted pull never leaves a
   truncated GGUF.

Layout of the GGUF cache, gguf/ under the cache root (cache.py: $DEEPSEEK_CPU_CACHE, default
~/.cache/deepseek-cpu, so ~/.cache/deepseek-cpu/gguf):
    <org>--<name>/<sha>/<converter key>/<name>-<quant>.gguf (+ .json record)
    <org>--<name>/refs/<revision>           last sha seen for a branch/tag (offline use)
With `output_dir` the GGUF is written as <output_dir>/<name>-<quant>.gguf with its
.json record next to it; the record decides whether it can be reused.

The modules, one concern each (none imports deepseek_cpu.runtime.llama or llama_cpp at import time):
    pipeline.py    `pull()` itself: the steps above, in order, and `PullResult`
    errors.py      `PullError`, and which exceptions count as network / server errors
    settings.py    the HF_* settings, read at call time
    gguf_cache.py  where a GGUF goes, its .json record, the offline refs, the converter key
    client.py      the huggingface_hub calls: retries with backoff, errors -> PullError,
                   resolve / list / plan / download
    disk_plan.py   the disk estimate and the free-space check
    conversion.py  the architecture pre-flight, convert, and llama.cpp's quantizer
    download.py    resumable, checked downloads of one blob into the HF cache
    command.py     the `deepseek-cpu pull` command (a built-in plugin)
"""
from __future__ import annotations

from ..quantization import types as quant_types
from .client import INDEX, META_FILES, RETRY_DELAYS
from .conversion import INTERMEDIATE, quantize
from .disk_plan import estimate_disk, free_bytes
from .errors import PullError
from .gguf_cache import CONVERTER_FORMAT, converter_key, gguf_cache_dir
from .pipeline import PullResult, pull
from .settings import hf_cache_dir, hf_endpoint, hf_offline

# The types and their facts live in quantization/types.py: written by our converter directly (no
# llama.cpp pass), or quantized by llama.cpp from a bf16 intermediate.
DIRECT = quant_types.DIRECT
QUANTS = quant_types.NAMES

# The names above are the ones `deepseek_cpu.hub` has always offered. Values are copies
# bound at import: to change one for a pull (a test shortening RETRY_DELAYS, faking
# free_bytes), set it on the module that uses it (hub.client, hub.disk_plan).
__all__ = [
    "pull", "PullError", "PullResult", "quantize", "estimate_disk", "free_bytes",
    "hf_endpoint", "hf_cache_dir", "hf_offline", "gguf_cache_dir", "converter_key",
    "CONVERTER_FORMAT", "DIRECT", "QUANTS", "INTERMEDIATE", "META_FILES", "INDEX", "RETRY_DELAYS",
]
