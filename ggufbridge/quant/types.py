"""What the pinned quantiser (llama.cpp 0c1e57098, tools/quantize + src/llama-quant.cpp) accepts, as tables.

File types are the names `llama-quantize` takes as its `type` argument (tools/quantize/quantize.cpp:35-77); tensor
types are ggml type names (`--tensor-type NAME=TYPE`). The fallback table is the runtime's rule for a row length
that is not a whole number of blocks (src/llama-quant.cpp:390-440); we apply it ourselves so that a recipe's
per-tensor choice, and any fallback, is known and reported before the quantiser runs.
"""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ggufbridge.errors import QuantError

# llama-quantize file type -> (tensor type most tensors get, needs an importance matrix, what it is)
FILE_TYPES: dict[str, tuple[str, bool, str]] = {
    "Q4_0": ("Q4_0", False, "4.5 bpw, 32-blocks"),
    "Q4_1": ("Q4_1", False, "5.0 bpw, 32-blocks"),
    "Q5_0": ("Q5_0", False, "5.5 bpw, 32-blocks"),
    "Q5_1": ("Q5_1", False, "6.0 bpw, 32-blocks"),
    "MXFP4_MOE": ("MXFP4", False, "MXFP4 experts, Q8_0 elsewhere"),
    "IQ1_S": ("IQ1_S", True, "1.56 bpw"),
    "IQ1_M": ("IQ1_M", True, "1.75 bpw"),
    "IQ2_XXS": ("IQ2_XXS", True, "2.06 bpw"),
    "IQ2_XS": ("IQ2_XS", True, "2.31 bpw"),
    "IQ2_S": ("IQ2_XS", True, "2.5 bpw mix"),
    "IQ2_M": ("IQ2_S", True, "2.7 bpw mix"),
    "TQ1_0": ("TQ1_0", False, "1.69 bpw ternary"),
    "TQ2_0": ("TQ2_0", False, "2.06 bpw ternary"),
    "Q2_K": ("Q2_K", False, "K-quant mix around 2.6 bpw"),
    "Q2_K_S": ("Q2_K", True, "K-quant mix, smaller"),
    "IQ3_XXS": ("IQ3_XXS", True, "3.06 bpw"),
    "IQ3_XS": ("IQ3_S", False, "3.3 bpw mix"),
    "IQ3_S": ("IQ3_S", False, "3.44 bpw"),
    "IQ3_M": ("IQ3_S", False, "3.66 bpw mix"),
    "Q3_K_S": ("Q3_K", False, "K-quant mix around 3.4 bpw"),
    "Q3_K_M": ("Q3_K", False, "K-quant mix around 3.7 bpw"),
    "Q3_K_L": ("Q3_K", False, "K-quant mix around 4.0 bpw"),
    "IQ4_NL": ("IQ4_NL", False, "4.5 bpw non-linear, 32-blocks"),
    "IQ4_XS": ("IQ4_XS", False, "4.25 bpw non-linear"),
    "Q4_K_S": ("Q4_K", False, "K-quant mix around 4.4 bpw"),
    "Q4_K_M": ("Q4_K", False, "K-quant mix around 4.6-4.9 bpw"),
    "Q5_K_S": ("Q5_K", False, "K-quant mix around 5.5 bpw"),
    "Q5_K_M": ("Q5_K", False, "K-quant mix around 5.7 bpw"),
    "Q6_K": ("Q6_K", False, "6.56 bpw"),
    "Q8_0": ("Q8_0", False, "8.5 bpw"),
    "F16": ("F16", False, "16 bpw"),
    "BF16": ("BF16", False, "16 bpw"),
    "F32": ("F32", False, "32 bpw"),
}
# llama-quantize's own short aliases
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}

# Tensor types a recipe may name (gguf-py must know them too: the result is read back with it).
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q5_0", "Q5_1", "Q4_K", "Q4_0", "Q4_1", "IQ4_XS",
                "IQ4_NL", "Q3_K", "IQ3_S", "IQ3_XXS", "Q2_K", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S", "MXFP4")
# Tensor types the quantiser refuses to produce without an importance matrix (src/llama-quant.cpp:856-875).
NEEDS_IMATRIX = {"IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S"}
# A row length that is not a whole number of blocks: the type the runtime substitutes (src/llama-quant.cpp:403-420).
# Anything whose substitute does not fit either becomes F16.
FALLBACK = {
    "IQ1_S": "IQ4_NL", "IQ1_M": "IQ4_NL", "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL", "IQ2_S": "IQ4_NL",
    "IQ3_XXS": "IQ4_NL", "IQ3_S": "IQ4_NL", "IQ4_XS": "IQ4_NL",
    "Q2_K": "Q4_0", "Q3_K": "Q4_0", "TQ1_0": "Q4_0", "TQ2_0": "Q4_0",
    "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0",
}


def file_type(name: str) -> str:
    """The canonical llama-quantize file type for a user's spelling (case-insensitive, aliases resolved)."""
    up = name.strip().upper()
    up = ALIASES.get(up, up)
    if up not in FILE_TYPES:
        raise QuantError(f"unknown quantisation type {name!r}: expected one of {', '.join(FILE_TYPES)} "
                         f"(or a recipe with --recipe)")
    return up


def tensor_type(name: str, where: str) -> str:
    up = name.strip().upper()
    if up not in TENSOR_TYPES:
        raise QuantError(f"{where}: expected a tensor type among {', '.join(TENSOR_TYPES)}, found {name!r}")
    return up


def block_size(t: str) -> int:
    return GGML_QUANT_SIZES[GGMLQuantizationType[t]][0]


def bits_per_weight(t: str) -> float:
    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[t]]
    return nbytes * 8 / block


def fit_row(t: str, row: int) -> str:
    """The type a tensor of row length `row` really gets when `t` is asked for (the runtime's fallback rule)."""
    if row % block_size(t) == 0:
        return t
    sub = FALLBACK.get(t)
    if sub is not None and row % block_size(sub) == 0:
        return sub
    return "F16"


def nbytes(t: str, shape: tuple[int, ...]) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[t]]
    n = 1
    for d in shape:
        n *= d
    return n // block * size
