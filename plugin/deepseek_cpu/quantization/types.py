"""The quantization types deepseek-cpu knows: one table, read by everything else.

Each user-facing name (`convert --outtype`, `pull --quant`, `synth --quant`, file names)
maps to its facts:

  * `ftype`: llama.cpp's file type (`general.file_type`), as the name llama.cpp's
    constant (`llama_ftype`, e.g. LLAMA_FTYPE_MOSTLY_Q4_K_M) and gguf.LlamaFileType
    (`file_type`) share;
  * `tensor_type`: the main GGML tensor type of that file type, as named by
    gguf.GGMLQuantizationType (`ggml_type`): llama-quantize's default type for it
    (K-quant mixes and schemes give some tensors other types: Scheme.tensor_type in
    quantization/schemes.py);
  * `bpw`: approximate bits per weight of the whole file, for `pull`'s disk estimate;
  * `direct`: True when our converter writes it (converters/base.py's OUTTYPES), False
    when llama.cpp's quantizer makes it from a bf16 intermediate (`pull`).

Readers: the converters (converters/base.py's OUTTYPES), the conversion (general.file_type),
the schemes built on these types (quantization/schemes.py) and the quantizer, the `convert` and
`pull` commands, the hub (the quantizer's ftype, the disk estimate) and Llama.from_hub's default.
A type added here is offered by `pull` (and by `convert` if direct). Plugins' own schemes go
through the deepseek_cpu_quant_schemes hook instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import gguf

# (gguf is imported only when an enum is asked for: `from deepseek_cpu import Llama`
# reads DEFAULT_PULL and should not pay for gguf and its dependencies)


@dataclass(frozen=True)
class QuantType:
    name: str          # user-facing, lower case
    ftype: str         # llama.cpp's file type: LLAMA_FTYPE_<ftype>, gguf.LlamaFileType.<ftype>
    tensor_type: str   # main GGML tensor type: gguf.GGMLQuantizationType.<tensor_type>
    bpw: float         # approximate bits per weight of the file, for disk planning
    direct: bool       # written by our converter (else llama.cpp quantizes a bf16 intermediate)

    @property
    def llama_ftype(self) -> str:
        """The name of llama.cpp's constant for this file type (an attribute of llama_cpp)."""
        return f"LLAMA_FTYPE_{self.ftype}"

    @property
    def file_type(self) -> "gguf.LlamaFileType":
        """general.file_type of a GGUF of this type."""
        import gguf
        return gguf.LlamaFileType[self.ftype]

    @property
    def ggml_type(self) -> "gguf.GGMLQuantizationType":
        import gguf
        return gguf.GGMLQuantizationType[self.tensor_type]


# In the order the CLI lists them: the converter's own types first, then llama.cpp's.
QUANT_TYPES: dict[str, QuantType] = {t.name: t for t in (
    QuantType("f32", "ALL_F32", "F32", 32, True),
    QuantType("f16", "MOSTLY_F16", "F16", 16, True),
    QuantType("bf16", "MOSTLY_BF16", "BF16", 16, True),
    QuantType("q8_0", "MOSTLY_Q8_0", "Q8_0", 8.5, True),
    QuantType("q4_0", "MOSTLY_Q4_0", "Q4_0", 4.5, False),
    QuantType("q4_1", "MOSTLY_Q4_1", "Q4_1", 5.0, False),
    QuantType("q5_0", "MOSTLY_Q5_0", "Q5_0", 5.5, False),
    QuantType("q5_1", "MOSTLY_Q5_1", "Q5_1", 6.0, False),
    QuantType("q2_k", "MOSTLY_Q2_K", "Q2_K", 3.4, False),
    QuantType("q3_k_s", "MOSTLY_Q3_K_S", "Q3_K", 3.5, False),
    QuantType("q3_k_m", "MOSTLY_Q3_K_M", "Q3_K", 3.9, False),
    QuantType("q3_k_l", "MOSTLY_Q3_K_L", "Q3_K", 4.3, False),
    QuantType("q4_k_s", "MOSTLY_Q4_K_S", "Q4_K", 4.6, False),
    QuantType("q4_k_m", "MOSTLY_Q4_K_M", "Q4_K", 4.9, False),
    QuantType("q5_k_s", "MOSTLY_Q5_K_S", "Q5_K", 5.6, False),
    QuantType("q5_k_m", "MOSTLY_Q5_K_M", "Q5_K", 5.7, False),
    QuantType("q6_k", "MOSTLY_Q6_K", "Q6_K", 6.6, False),
    QuantType("iq4_nl", "MOSTLY_IQ4_NL", "IQ4_NL", 4.5, False),
    QuantType("iq4_xs", "MOSTLY_IQ4_XS", "IQ4_XS", 4.3, False),
    # routed experts MXFP4, everything else q8_0: DeepSeek-V4's release keeps its MXFP4 experts bit for
    # bit (llama.cpp copies a tensor already in its target type)
    QuantType("mxfp4_moe", "MOSTLY_MXFP4_MOE", "MXFP4", 4.6, False),
)}

NAMES: tuple[str, ...] = tuple(QUANT_TYPES)
# written by our converter directly (convert --outtype)
DIRECT: tuple[str, ...] = tuple(n for n, t in QUANT_TYPES.items() if t.direct)
# made by llama.cpp's quantizer from a bf16 intermediate
LLAMA_QUANTIZED: tuple[str, ...] = tuple(n for n, t in QUANT_TYPES.items() if not t.direct)
# what `pull` / Llama.from_hub produce unless told otherwise
DEFAULT_PULL = "q4_k_m"
