"""What a converter hands to the GGUF writer: metadata with explicit kinds (`KV`), a list of lazily built output
tensors (`PlannedTensor`) and notes for the user, together a `ConversionPlan`. It lives beside the writer, which is
all that reads it; the converters (ggufbridge.arch) build it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ggufbridge.checkpoint.safetensors import TensorRef


@dataclass
class PlannedTensor:
    """One GGUF tensor. `build()` reads its sources and returns the array in numpy (PyTorch) order, either in the
    source's storage dtype (BF16 as uint16 bit patterns) when only permutations were applied, or as float32."""

    name: str
    shape: tuple[int, ...]
    sources: list[TensorRef]
    build: Callable[[], tuple[np.ndarray, str]]  # -> (array, dtype tag "F32" | "F16" | "BF16" | ...)
    force_f32: bool = False  # element-wise weights the runtime needs in F32 (norms, biases, SSM parameters)
    ggml_type: str | None = None  # forces the stored GGML type by name (e.g. "I64" for DSpark's d2t ids)

    @property
    def source_bytes(self) -> int:
        return sum(s.nbytes for s in self.sources)


@dataclass
class KV:
    key: str
    value: object
    kind: str  # "u32" | "f32" | "bool" | "str" | "arr"  — explicit: the runtime's reads are type-strict


NOTE_LEVELS = ("info", "warning")


@dataclass(frozen=True)
class Note:
    """A one-line fact worth telling the user; `convert` logs it at its level."""

    text: str
    level: str = "info"  # one of NOTE_LEVELS


@dataclass
class ConversionPlan:
    arch: str
    kvs: list[KV] = field(default_factory=list)
    tensors: list[PlannedTensor] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)

    def note(self, text: str, level: str = "info") -> None:
        self.notes.append(Note(text, level))

    def u32(self, key: str, v: int) -> None:
        self.kvs.append(KV(key, int(v), "u32"))

    def f32(self, key: str, v: float) -> None:
        self.kvs.append(KV(key, float(v), "f32"))

    def bool(self, key: str, v: bool) -> None:
        self.kvs.append(KV(key, bool(v), "bool"))

    def str(self, key: str, v: str) -> None:
        self.kvs.append(KV(key, v, "str"))

    def arr(self, key: str, v: list) -> None:
        self.kvs.append(KV(key, list(v), "arr"))
