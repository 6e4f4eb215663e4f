"""The output folder's manifest.json (written by `convert`, read by `serve`/`plan`/`verify`) and file hashing."""

from __future__ import annotations

import hashlib
from pathlib import Path

MANIFEST = "manifest.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()
