"""The files `ggufbridge convert` left in OUT_DIR, found through OUT_DIR/manifest.json.

Format: {"files": [{"role": "target"|"mmproj"|"draft", "path": <relative>, "bytes", "sha256", "type"}],
"source": {...}, "ggufbridge": <version>}. Sizes are checked on every load; hashes only on request
(hashing 70 GB takes minutes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ggufbridge.errors import ManifestError
from ggufbridge.ggufio.manifest import MANIFEST, sha256_file

ROLES = ("target", "mmproj", "draft")


@dataclass(frozen=True)
class Artifact:
    role: str
    path: Path
    bytes: int
    sha256: str | None
    type: str | None


@dataclass(frozen=True)
class Artifacts:
    out_dir: Path
    files: dict  # role -> Artifact

    @property
    def target(self) -> Artifact:
        return self.files["target"]

    @property
    def mmproj(self) -> Artifact | None:
        return self.files.get("mmproj")

    @property
    def draft(self) -> Artifact | None:
        return self.files.get("draft")


def load_artifacts(out_dir: str | Path, verify_hashes: bool = False) -> Artifacts:
    out = Path(out_dir)
    mpath = out / MANIFEST
    if not mpath.is_file():
        raise ManifestError(f"{mpath} not found: OUT_DIR must be a folder written by `ggufbridge convert`")
    try:
        data = json.loads(mpath.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestError(f"{mpath} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        raise ManifestError(f"{mpath}: expected an object with a \"files\" list, found {type(data).__name__}"
                            + ("" if not isinstance(data, dict) else f" with keys {sorted(data)}"))
    files: dict[str, Artifact] = {}
    for i, entry in enumerate(data["files"]):
        where = f"{mpath} files[{i}]"
        if not isinstance(entry, dict):
            raise ManifestError(f"{where}: expected an object, found {entry!r}")
        role, rel = entry.get("role"), entry.get("path")
        if role not in ROLES:
            raise ManifestError(f"{where}: role expected one of {', '.join(ROLES)}, found {role!r}")
        if role in files:
            raise ManifestError(f"{where}: a second {role!r} file; expected at most one per role")
        if not isinstance(rel, str) or not rel or PurePosixPath(rel).is_absolute() or ".." in PurePosixPath(rel).parts:
            raise ManifestError(f"{where}: path expected a relative path inside OUT_DIR, found {rel!r}")
        size = entry.get("bytes")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ManifestError(f"{where}: bytes expected a non-negative integer, found {size!r}")
        path = out / rel
        if not path.is_file():
            raise ManifestError(f"{where}: {path} is missing")
        found = path.stat().st_size
        if found != size:
            raise ManifestError(f"{where}: {path} has {found} bytes, the manifest says {size} (incomplete copy?)")
        digest = entry.get("sha256")
        if verify_hashes and digest:
            actual = sha256_file(path)
            if actual != digest:
                raise ManifestError(f"{where}: {path} sha256 {actual} differs from the manifest's {digest}")
        files[role] = Artifact(role, path, size, digest, entry.get("type"))
    if "target" not in files:
        raise ManifestError(f"{mpath}: no file with role 'target'")
    return Artifacts(out, files)
