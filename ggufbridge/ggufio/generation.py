"""One conversion's files in an output folder: a "generation" (GGUFs + manifest.json), committed as a unit.

`convert` writes every file under a temporary name (`writer.tmp_name`), then the pending manifest, and only then
renames: files of the previous generation that the new one does not rewrite are deleted, the GGUFs take their
final names, and manifest.json is replaced last. The pending manifest is the journal: if the process dies during
those renames (SIGKILL; SIGINT/SIGTERM are held back, see `ggufbridge.signals.deferred`), the next run finds it
beside its writer's complete temporary files and finishes the commit (`recover`), so the folder never stays with
GGUFs that its manifest does not describe.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path, PurePosixPath

from ggufbridge.errors import ManifestError
from ggufbridge.ggufio.manifest import MANIFEST
from ggufbridge.ggufio.writer import part_pid, pid_alive, tmp_name
from ggufbridge.untrusted import load_json

log = logging.getLogger(__name__)


def existing_outputs(out: Path) -> list[str]:
    """Names of what makes `out` hold a conversion already: manifest.json and final-named GGUFs."""
    if not out.is_dir():
        return []
    return sorted(p.name for p in out.iterdir()
                  if not p.name.startswith(".") and (p.name == MANIFEST or p.suffix.lower() == ".gguf"))


def _listed(manifest: Path) -> set[str]:
    try:
        data = load_json(manifest, ManifestError, max_bytes=16 << 20, what="manifest")
        return {f["path"] for f in data["files"] if _plain_name(f["path"])}
    except (ManifestError, KeyError, TypeError):
        return set()


def _plain_name(rel) -> bool:
    return isinstance(rel, str) and len(PurePosixPath(rel).parts) == 1 and rel not in (".", "..")


def commit(out: Path, pending: Path, renames: list[tuple[Path, Path]]) -> None:
    """Make `pending` (a complete manifest whose files are complete under their temporary names) the folder's
    generation. Call with termination signals deferred."""
    new = _listed(pending)
    for rel in sorted(_listed(out / MANIFEST) - new):
        (out / rel).unlink(missing_ok=True)
        log.info("removed %s (previous conversion, replaced by --force)", out / rel)
    for tmp, final in renames:
        if tmp.exists():
            os.replace(tmp, final)
    os.replace(pending, out / MANIFEST)


def recover(out: Path) -> None:
    """Finish a commit that a dead process started (its pending manifest and temporary files are still there)."""
    for pending in sorted(out.glob(f".{MANIFEST}.*.part")):
        pid = part_pid(pending)
        if pid is None or pid_alive(pid):
            continue
        try:
            files = load_json(pending, ManifestError, max_bytes=16 << 20, what="manifest")["files"]
            entries = [(f["path"], int(f["bytes"])) for f in files]
        except (ManifestError, ValueError, OverflowError, KeyError, TypeError):  # OverflowError: "bytes": 1e400
            continue  # cut while being written: its GGUFs were never renamed; remove_stale_parts deletes it
        renames, complete = [], True
        for rel, size in entries:
            if not _plain_name(rel):
                complete = False
                break
            tmp, final = tmp_name(out / rel, pid), out / rel
            if tmp.is_file() and tmp.stat().st_size == size:
                renames.append((tmp, final))
            elif not (final.is_file() and final.stat().st_size == size):
                complete = False
                break
        if complete:
            commit(out, pending, renames)
            log.info("%s: completed the commit of a conversion that process %d left unfinished", out, pid)
