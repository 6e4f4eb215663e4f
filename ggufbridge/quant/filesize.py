"""Exact size of a GGUF file llama-quantize will write, before it is written.

The layout (ggml/src/gguf.cpp, `gguf_write_to_buf`): the fixed header (magic, version, tensor and KV counts),
every KV pair, every tensor's info (name, dims, type, offset), padding to `general.alignment`, then each tensor's
data padded to the alignment again. Tensor data bytes are ggml's per-type block formula (gguf-py's
GGML_QUANT_SIZES: rows cut into blocks of `block` weights stored in `type_size` bytes).

The KV section of a quantised file is not the source's: llama-quantize adds `general.quantization_version`, sets
`general.file_type`, writes the imatrix provenance keys and our overrides. Rather than re-implement that, the
header is measured on one real output made the same way (`HeaderModel.measure`) of the source's header twin
(ggufbridge.quant.probe.write_header_twin: same KVs and tensor table, two elements per axis), and only the
string values that differ between that file and the planned one (recipe name, file type, fallbacks) are
accounted for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ggufbridge.quant import types as qt

DEFAULT_ALIGNMENT = 32


def pad(n: int, align: int) -> int:
    return n + (-n) % align


def _kv_str_bytes(key: str, value: str) -> int:
    # key (u64 length + bytes), value type (u32), value (u64 length + bytes)
    return 8 + len(key.encode()) + 4 + 8 + len(value.encode())


def header_bytes_unpadded(path) -> tuple[int, int, dict[str, str]]:
    """(bytes before the alignment padding, alignment, the file's string KVs) from a GGUF's own structure."""
    from ggufbridge.ggufio.reader import read_header

    h = read_header(path)
    align = h.kv.get("general.alignment", DEFAULT_ALIGNMENT)
    strings = {k: v for k, v in h.kv.items() if isinstance(v, str)}
    return h.header_end, int(align), strings


@dataclass
class HeaderModel:
    """A measured header and its string KVs; `bytes_for` gives the padded header of a file that differs only in
    the values (or presence) of some string KVs."""

    unpadded: int
    alignment: int
    strings: dict[str, str]

    @classmethod
    def measure(cls, path) -> "HeaderModel":
        n, align, strings = header_bytes_unpadded(Path(path))
        return cls(n, align, strings)

    def bytes_for(self, strings: dict[str, str | None]) -> int:
        """Padded header bytes when each key of `strings` holds that value (None: absent)."""
        n = self.unpadded
        for key, value in strings.items():
            old = self.strings.get(key)
            if old is not None:
                n -= _kv_str_bytes(key, old)
            if value is not None:
                n += _kv_str_bytes(key, value)
        return pad(n, self.alignment)


def tensor_bytes(t: str, shape: tuple[int, ...], align: int = DEFAULT_ALIGNMENT) -> int:
    """Bytes a tensor of type `t` takes in the data section, its alignment padding included."""
    return pad(qt.nbytes(t, shape), align)


def file_bytes(header: HeaderModel, strings: dict[str, str | None], types: dict[str, str],
               shapes: dict[str, tuple[int, ...]]) -> int:
    """The whole file: header (with those string KVs) + every tensor at its type, padded."""
    return header.bytes_for(strings) + sum(tensor_bytes(types[n], shapes[n], header.alignment) for n in shapes)
