"""`verify(out_dir, source=...)`: is a convert output folder what it claims to be? (The `verify` command's library:
it checks conversion output and lives beside `convert`, not under quant/.)

1. Every file of manifest.json exists with the recorded size and sha256 (and nothing is left half-written).
2. With the source checkpoint: the manifest's source hashes match it, and every tensor stored unquantised
   (F32/F16/BF16) is byte-for-byte what the converter produces from that source now. The expected bytes come from
   re-running the conversion plan (`ggufbridge.convert.plan_outputs`, the same `build()` and `encode()` the
   writer uses), so no mapping is re-implemented here: a tensor copied or only permuted is compared with the source
   bytes themselves, one with an arithmetic transform (norm +1, -exp(A_log)) with its recomputation.
   Quantised tensors are not comparable bit-for-bit and are counted as such.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ggufbridge.checkpoint.model_dir import ModelDir
from ggufbridge.convert import plan_outputs
from ggufbridge.errors import GGUFFileError, ManifestError
from ggufbridge.ggufio.manifest import Manifest, read_manifest
from ggufbridge.files import sha256_file
from ggufbridge.ggufio.reader import read_header

COMPARABLE = {"F32", "F16", "BF16"}


@dataclass
class FileCheck:
    role: str
    path: str
    ok: bool
    detail: str


@dataclass
class VerifyReport:
    out_dir: Path
    files: list[FileCheck] = field(default_factory=list)
    source_files: list[FileCheck] = field(default_factory=list)
    exact: int = 0  # tensors equal to the source bytes (no transform, or permutation only)
    recomputed: int = 0  # tensors equal to the converter's recomputation (arithmetic transform / type change)
    quantised: int = 0  # not comparable bit-for-bit
    mismatches: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (all(f.ok for f in self.files) and all(f.ok for f in self.source_files) and not self.mismatches)

    def format(self) -> str:
        lines = [f"verify {self.out_dir}"]
        lines += [f"  {'ok ' if f.ok else 'BAD'} {f.role:<7} {f.path}  {f.detail}" for f in self.files]
        lines += [f"  {'ok ' if f.ok else 'BAD'} source  {f.path}  {f.detail}" for f in self.source_files]
        if self.exact or self.recomputed or self.quantised or self.mismatches:
            lines.append(f"  tensors: {self.exact} equal to the source bytes, {self.recomputed} equal to the "
                         f"converter's recomputation, {self.quantised} quantised (not comparable), "
                         f"{len(self.mismatches)} differ")
        lines += [f"  DIFFERS {m}" for m in self.mismatches]
        lines += [f"  note: {n}" for n in self.notes]
        lines.append("OK" if self.ok else "FAILED")
        return "\n".join(lines)


def _check_files(manifest: Manifest, report: VerifyReport) -> None:
    for f in manifest.files.values():
        problem = _not_a_file(f.path)
        if problem:
            report.files.append(FileCheck(f.role, f.rel, False, problem))
            continue
        size = f.path.stat().st_size
        if size != f.bytes:
            report.files.append(FileCheck(f.role, f.rel, False, f"size {size}, manifest says {f.bytes}"))
            continue
        if f.sha256 is None:
            report.files.append(FileCheck(f.role, f.rel, False, "no sha256 in the manifest"))
            continue
        digest = sha256_file(f.path)
        ok = digest == f.sha256
        report.files.append(FileCheck(f.role, f.rel, ok, "sha256 matches" if ok else
                                      f"sha256 {digest[:16]}…, manifest says {f.sha256[:16]}…"))
    leftovers = sorted(p.name for p in manifest.path.parent.iterdir() if p.name.endswith(".part"))
    if leftovers:
        report.notes.append(f"half-written temporary files present: {', '.join(leftovers)}")
    _check_unlisted(manifest, report)


def _not_a_file(path: Path) -> str | None:
    """Why `path` (followed if it is a symlink) cannot be checked, or None for a regular file."""
    import stat

    try:
        st = path.stat()
    except FileNotFoundError:
        return f"missing (dangling symlink to {os.readlink(path)})" if path.is_symlink() else "missing"
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a device or special file"
        via = f" (symlink to {os.readlink(path)})" if path.is_symlink() else ""
        return f"not a regular file: {kind}{via}"
    return None


def _check_unlisted(manifest: Manifest, report: VerifyReport) -> None:
    """A GGUF beside the manifest but not in it (an older conversion's) is what a user picking a file by name
    may load by mistake: reported as a failure. An importance matrix (general.type "imatrix") is a note."""
    listed = {f.path.name for f in manifest.files.values()}
    for p in sorted(manifest.path.parent.glob("*.gguf")):
        if p.name in listed or p.name.startswith("."):
            continue
        try:
            kind = read_header(p).kv.get("general.type")
        except GGUFFileError:
            kind = None
        if kind == "imatrix":
            report.notes.append(f"{p.name}: an importance matrix, not part of the conversion")
        else:
            report.files.append(FileCheck("unlisted", p.name, False, "a GGUF that manifest.json does not list "
                                          "(left by another conversion?): not verified"))


def _check_source_hashes(md_path: Path, manifest: Manifest, report: VerifyReport) -> None:
    for name, digest in sorted(manifest.source.items()):
        p = md_path / name
        if not p.is_file():
            report.source_files.append(FileCheck("source", name, False, "missing from the source folder"))
            continue
        got = sha256_file(p)
        report.source_files.append(FileCheck("source", name, got == digest, "sha256 matches" if got == digest
                                             else "differs from the file that was converted"))


def _compare_plan(path: Path, plan, report: VerifyReport, role: str) -> None:
    from gguf import GGMLQuantizationType

    from ggufbridge.ggufio.writer import encode

    header = read_header(path)
    stored = {t.name: t for t in header.tensors}
    planned = {t.name for t in plan.tensors}
    extra = sorted(set(stored) - planned)
    if extra:
        report.mismatches.append(f"{role}: {len(extra)} tensor(s) the source does not produce, e.g. {extra[0]}")
    for t in plan.tensors:
        if t.name not in stored:
            report.mismatches.append(f"{role}: {t.name} is planned from the source but missing from {path.name}")
            continue
        info = stored[t.name]
        tname, n = info.type, info.nbytes
        if tname not in COMPARABLE:
            report.quantised += 1
            continue
        arr, tag = t.build()
        want = np.ascontiguousarray(encode(arr, tag, GGMLQuantizationType[tname])).reshape(-1).view(np.uint8)
        got = header.tensor_data(info)
        if want.size != n or not np.array_equal(want, got):
            diff = "size differs" if want.size != n else f"{int(np.count_nonzero(want != got))} byte(s) differ"
            report.mismatches.append(f"{role}: {t.name} ({tname}) is not what the source converts to ({diff})")
        elif tag == tname and _same_values(t, arr):
            report.exact += 1
        else:
            report.recomputed += 1


def _fingerprint(a: np.ndarray) -> tuple[int, int, int]:
    """Order-independent summary of a tensor's bit patterns: equal for an array and any permutation of it."""
    bits = a.reshape(-1).view(f"u{a.dtype.itemsize}").astype(np.uint64)
    return bits.size, int(bits.sum(dtype=np.uint64)), int((bits * bits).sum(dtype=np.uint64))


def _same_values(t, built: np.ndarray) -> bool:
    """Whether `built` holds exactly the source's stored values (a copy or a permutation, no arithmetic)."""
    if any(s.dtype != t.sources[0].dtype for s in t.sources):
        return False
    parts = [s.read() for s in t.sources]
    if any(p.dtype.itemsize != built.dtype.itemsize for p in parts):
        return False
    fps = [_fingerprint(p) for p in parts]
    total = (sum(f[0] for f in fps), sum(f[1] for f in fps) % 2**64, sum(f[2] for f in fps) % 2**64)
    return total == _fingerprint(built)


def verify(out_dir, source=None, draft=None) -> VerifyReport:
    """Check an output folder against its manifest and, given `source` (and `draft`), against the checkpoint."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise ManifestError(f"{out_dir}: not a folder")
    manifest = read_manifest(out_dir)
    if draft is not None and source is None:
        raise ManifestError("--draft-source needs --source: the draft is converted against its target")
    if draft is not None and "draft" not in manifest.files:
        raise ManifestError(f"--draft-source: {out_dir}/manifest.json lists no draft to compare it with")
    report = VerifyReport(out_dir)
    _check_files(manifest, report)
    if source is None:
        report.notes.append("no --source given: tensors were not compared with the checkpoint")
        return report

    md = ModelDir.open(source)
    _check_source_hashes(md.path, manifest, report)
    roles = manifest.files
    # outtype only names files and sets general.file_type; every tensor's build() is independent of it
    outputs = plan_outputs(md, outtype="f32", basename=None, draft=draft if "draft" in roles else None,
                           mmproj="mmproj" in roles)
    if "draft" in roles and draft is None:
        report.notes.append("draft not compared with a checkpoint: pass its folder with --draft-source")
    for o in outputs:
        entry = roles.get(o.role)
        if entry is None:
            continue
        path = entry.path
        if not path.is_file():
            continue
        plan = o.plan
        if o.role == "mmproj":
            plan = _mmproj_plan_like(md, path, plan)
        _compare_plan(path, plan, report, o.role)
    return report


def _mmproj_plan_like(md, path: Path, default_plan):
    """The manifest does not record --downsample: use the mode whose planned tensors are the file's."""
    names = {t.name for t in read_header(path).tensors}
    if {t.name for t in default_plan.tensors} == names:
        return default_plan
    for mode in ("16x", "4x"):
        plans = [o.plan for o in plan_outputs(md, outtype="f32", basename=None, downsample=mode) if o.role == "mmproj"]
        if plans and {t.name for t in plans[0].tensors} == names:
            return plans[0]
    return default_plan
