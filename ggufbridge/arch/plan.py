"""What a converter hands to the GGUF writer (metadata and a list of lazily built output tensors), and the pieces
every converter builds it from: one row type for its name tables (`Row`), one planned-tensor constructor that checks
the source shape (`planned`), one check that no source tensor is left unconverted (`check_leftover`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from ggufbridge.checkpoint.safetensors import TensorRef
from ggufbridge.errors import CheckpointError


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


@dataclass
class ConversionPlan:
    arch: str
    kvs: list[KV] = field(default_factory=list)
    tensors: list[PlannedTensor] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one-line facts worth telling the user

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


@dataclass(frozen=True)
class Row:
    """One line of a converter's name table: the GGUF tensor `gguf` comes from the source tensor `source`, whose
    shape must be `shape(params)` (the converter's params object), through the named `transform` (None: copied as
    stored)."""

    gguf: str
    source: str
    shape: Callable[[Any], tuple[int, ...]]
    transform: str | None = None


Transform = Callable[[np.ndarray, str], tuple[np.ndarray, str]]  # (array, dtype tag) -> (array, dtype tag)


def planned(name: str, ref: TensorRef, want: tuple, *, transform: Transform | None = None,
            stored_shape: tuple | None = None, force_f32: bool = False, what: str = "tensor") -> PlannedTensor:
    """The GGUF tensor `name` built from `ref`, which must have the shape `want` the config implies (CheckpointError
    naming both otherwise). `transform` runs at build time on the source array in its storage dtype; `stored_shape`
    is the output's shape when the transform changes it."""
    want = tuple(want)
    if ref.shape != want:
        raise CheckpointError(f"{what} {ref.name}: expected shape {list(want)} from the config, "
                              f"found {list(ref.shape)}")

    def build():
        a = ref.read()
        return (a, ref.dtype) if transform is None else transform(a, ref.dtype)

    return PlannedTensor(name, tuple(stored_shape or want), [ref], build, force_f32=force_f32)


def check_leftover(names: Iterable[str], used: set[str], what: str, ignore: Callable[[str], bool] = lambda n: False):
    """Every source tensor is either converted (`used`) or deliberately ignored: one the converter does not know is
    an error, never silently dropped."""
    leftover = sorted(n for n in names if n not in used and not ignore(n))
    if leftover:
        raise CheckpointError(f"{len(leftover)} {what} tensor(s) not understood by the converter, e.g. {leftover[0]}")

