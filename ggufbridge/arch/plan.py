"""The pieces every converter builds its plan (ggufbridge.ggufio.plan: what the writer takes) from: one row type
for its name tables (`Row`), one planned-tensor constructor that checks the source shape (`planned`), one check that
no source tensor is left unconverted (`check_leftover`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from ggufbridge.checkpoint.safetensors import TensorRef
from ggufbridge.errors import CheckpointError
from ggufbridge.ggufio.plan import PlannedTensor


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

