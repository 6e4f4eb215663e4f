"""The files `ggufbridge convert` left in OUT_DIR, found through OUT_DIR/manifest.json (ggufbridge.ggufio.manifest).

Serving refuses anything doubtful: every listed file must exist with its recorded size (checked on every load);
hashes only on request (hashing 70 GB takes minutes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ggufbridge.errors import ManifestError
from ggufbridge.ggufio.manifest import ROLES, ManifestEntry, read_manifest
from ggufbridge.files import sha256_file

Artifact = ManifestEntry  # role, path, rel, bytes, sha256, type


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
    manifest = read_manifest(out)
    for a in manifest.files.values():
        where = f"{manifest.path}, {a.role} file"
        if not a.path.is_file():
            raise ManifestError(f"{where}: {a.path} is missing")
        found = a.path.stat().st_size
        if found != a.bytes:
            raise ManifestError(f"{where}: {a.path} has {found} bytes, the manifest says {a.bytes} (incomplete copy?)")
        if verify_hashes and a.sha256:
            actual = sha256_file(a.path)
            if actual != a.sha256:
                raise ManifestError(f"{where}: {a.path} sha256 {actual} differs from the manifest's {a.sha256}")
    return Artifacts(out, dict(manifest.files))


__all__ = ["ROLES", "Artifact", "Artifacts", "load_artifacts"]
