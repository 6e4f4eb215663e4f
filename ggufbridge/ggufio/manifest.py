"""The output folder's manifest.json (written by `convert` through `write_manifest`; read by `serve`/`run`/`plan`,
`verify`, `imatrix` and `run --image` through `read_manifest`).

Format: {"files": [{"role": "target"|"mmproj"|"draft", "path": <relative>, "bytes", "sha256", "type"}],
"source": {<file name>: <sha256>}, "ggufbridge": <version>}; other top-level keys are kept as `Manifest.extra`.
A manifest is untrusted input like a checkpoint:
`read_manifest` checks its structure and that every path stays inside the folder; what a reader does about files
that are missing or of the wrong size is its own policy (`serve` refuses, `verify` reports).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ggufbridge import __version__
from ggufbridge.errors import ManifestError
from ggufbridge.untrusted import load_json

MANIFEST = "manifest.json"
ROLES = ("target", "mmproj", "draft")


@dataclass(frozen=True)
class ManifestEntry:
    """One file of the manifest: `path` is inside the output folder; `sha256`/`type` may be absent."""

    role: str
    path: Path
    rel: str
    bytes: int
    sha256: str | None
    type: str | None

    @classmethod
    def of(cls, role: str, path: Path, nbytes: int, sha256: str | None, type: str | None) -> "ManifestEntry":
        """The entry for a file written into the output folder (`path`: its final name, directly in the folder)."""
        return cls(role, Path(path), Path(path).name, nbytes, sha256, type)

    def to_dict(self) -> dict:
        return {"role": self.role, "path": self.rel, "bytes": self.bytes, "sha256": self.sha256, "type": self.type}


@dataclass(frozen=True)
class Manifest:
    path: Path
    files: dict[str, ManifestEntry]  # role -> entry; always holds "target"
    source: dict[str, str] = field(default_factory=dict)  # checkpoint file name -> sha256
    extra: dict = field(default_factory=dict)  # every other top-level key ("ggufbridge" version, script notes)


def write_manifest(dest: str | Path, files: list[ManifestEntry], source: dict[str, str] | None = None,
                   extra: dict | None = None) -> None:
    """Write a manifest to `dest` (the caller's temporary name, renamed into place by its commit, or OUT/manifest.json).
    What is written obeys the rules `read_manifest` checks: a target, one file per role, paths inside the folder."""
    roles = [f.role for f in files]
    bad = [r for r in roles if r not in ROLES]
    if bad or "target" not in roles or len(set(roles)) != len(roles):
        raise ManifestError(f"manifest files: expected one target and at most one file per role of "
                            f"{', '.join(ROLES)}, found roles {roles}")
    data = {"files": [f.to_dict() for f in files], "source": dict(source or {}), "ggufbridge": __version__,
            **(extra or {})}
    Path(dest).write_text(json.dumps(data, indent=2) + "\n")


def read_manifest(out_dir: str | Path) -> Manifest:
    """Parse and check OUT_DIR/manifest.json (not the files it names); ManifestError naming the problem."""
    out = Path(out_dir)
    mpath = out / MANIFEST
    if not mpath.is_file():
        raise ManifestError(f"{out}: no {MANIFEST} (expected a folder written by `ggufbridge convert`)")
    data = load_json(mpath, ManifestError, max_bytes=16 << 20, what="manifest")
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        raise ManifestError(f"{mpath}: expected an object with a \"files\" list, found {type(data).__name__}"
                            + ("" if not isinstance(data, dict) else f" with keys {sorted(data)}"))
    files: dict[str, ManifestEntry] = {}
    for i, entry in enumerate(data["files"]):
        where = f"{mpath} files[{i}]"
        if not isinstance(entry, dict):
            raise ManifestError(f"{where}: expected an object, found {entry!r}")
        role, rel = entry.get("role"), entry.get("path")
        if role not in ROLES:
            raise ManifestError(f"{where}: role expected one of {', '.join(ROLES)}, found {role!r}")
        if role in files:
            raise ManifestError(f"{where}: a second {role!r} file; expected at most one per role")
        if (not isinstance(rel, str) or not rel or "\0" in rel or PurePosixPath(rel).is_absolute()
                or ".." in PurePosixPath(rel).parts):
            raise ManifestError(f"{where}: path expected a relative path inside OUT_DIR, found {rel!r}")
        size = entry.get("bytes")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 2**64:
            raise ManifestError(f"{where}: bytes expected a file size (an integer in [0, 2^64)), "
                                f"found {str(size)[:40]}")
        digest, kind = entry.get("sha256"), entry.get("type")
        for key, value in (("sha256", digest), ("type", kind)):
            if value is not None and not isinstance(value, str):
                raise ManifestError(f"{where}: {key} expected a string, found {value!r}")
        files[role] = ManifestEntry(role, out / rel, rel, size, digest, kind)
    if "target" not in files:
        raise ManifestError(f"{mpath}: no file with role 'target'")
    source = data.get("source") or {}
    if not isinstance(source, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in source.items()):
        raise ManifestError(f"{mpath}: source expected an object of file name -> sha256, found {source!r}")
    for name in source:
        if not name or "\0" in name or PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts:
            raise ManifestError(f"{mpath}: source file name expected inside the checkpoint folder, found {name!r}")
    extra = {k: v for k, v in data.items() if k not in ("files", "source")}
    return Manifest(mpath, files, source, extra)
