"""Files and folders every part of ggufbridge shares: the cache folder and a file's sha256."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir() -> Path:
    """${GGUFBRIDGE_CACHE:-~/.cache/ggufbridge}: built runtimes, tokenizer fixtures, sensitivity measurements, the
    FFmpeg shim. scripts/build_runtime.sh spells the same rule in shell."""
    return Path(os.environ.get("GGUFBRIDGE_CACHE") or Path.home() / ".cache" / "ggufbridge")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 8 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()
