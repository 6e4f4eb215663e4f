"""Rename metadata keys of a GGUF file into a new file, everything else byte for byte.

Used where a runtime looks a value up under another key than the file's converter wrote (runtime.pairing: a
DSpark draft's `dspark.*` values for a runtime that reads `dflash.*`). Values keep their stored type and bytes;
the tensor table is copied as it is (its offsets are relative to the data section) and the data section follows
at the file's alignment, so tensors are not touched at all.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from gguf import GGUF_DEFAULT_ALIGNMENT

from ggufbridge.errors import GGUFFileError
from ggufbridge.ggufio.reader import MAGIC, VERSIONS, _Reader, read_header


def rename_keys(src: Path, dst: Path, renames: dict[str, str]) -> None:
    """Write `src` to `dst` with each key `old` of `renames` stored as `new` (a key already present is refused)."""
    h = read_header(src)  # validates the whole header first (bounded)
    clash = [new for old, new in renames.items() if new in h.kv and old in h.kv]
    if clash:
        raise GGUFFileError(f"{src}: cannot rename to {', '.join(clash)}: the file already has it")
    align = h.kv.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    align = align if isinstance(align, int) and align > 0 else GGUF_DEFAULT_ALIGNMENT
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf, open(dst, "wb") as out:
        r = _Reader(buf, h.file_bytes, src)
        if r.read(4) != MAGIC or r.unpack("<I") not in VERSIONS:
            raise GGUFFileError(f"{src}: not a GGUF v2/v3 file")
        r.count("tensor", 8)
        n_kv = r.count("metadata", 8)
        out.write(buf[:r.pos])  # magic, version and both counts: unchanged
        for _ in range(n_kv):
            start = r.pos
            key = r.string()
            after_key = r.pos
            r.value(r.unpack("<I"))
            if key in renames:
                new = renames[key].encode()
                out.write(struct.pack("<Q", len(new)) + new + buf[after_key:r.pos])
            else:
                out.write(buf[start:r.pos])
        out.write(buf[r.pos:h.header_end])  # the tensor table
        out.write(b"\0" * ((-out.tell()) % align))
        for pos in range(h.data_start, h.file_bytes, 64 << 20):
            out.write(buf[pos:min(pos + (64 << 20), h.file_bytes)])
