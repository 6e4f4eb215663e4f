"""The model files serve / run / plan / bench open, and the role of each: target, mmproj (projector), draft.

Four ways in, one result (`Artifacts`):

- **OUT_DIR with manifest.json** (what `ggufbridge convert` writes): the manifest names the roles; every listed file
  must exist with its recorded size (checked on every load; hashes only on request, hashing 70 GB takes minutes).
- **a folder of GGUFs without a manifest** (files as people download them): each file's role comes from its own
  metadata (`ROLE_OF_ARCH`); two candidates for one role is an error naming both.
- **MODEL.gguf [--mmproj FILE] [--model-draft FILE]**: the files given, each checked to be what its slot expects.
- **a hub spec** `hf://ORG/REPO[@REV][:QUANT]`: `checkpoint.hub_gguf.fetch_gguf` picks that quant's file(s) and the
  projector beside it (and the draft, when asked), downloads them resumably and sha256-checked, then as files.

Every file is untrusted input: its header goes through the bounded reader (ggufio.reader) and must declare the
architecture of its role. A model split by gguf-split (`NAME-00001-of-00003.gguf` ...) is one artifact: llama.cpp
is given the first part and finds the others by name; the memory plan reads every part's tensor table.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from ggufbridge.errors import GGUFFileError, ManifestError
from ggufbridge.files import sha256_file
from ggufbridge.ggufio.manifest import MANIFEST, ROLES, read_manifest
from ggufbridge.ggufio.names import ROLE_OF_ARCH, TARGET_ARCH, role_of
from ggufbridge.ggufio.reader import GGUFHeader, read_header

log = logging.getLogger(__name__)

# MiniCPM-V 4.7's vision tower: ours (`minicpmv4_6`, the pinned runtime's name for the same graph) and upstream
# llama.cpp's converter's (`minicpmv4_7`, after our pin; docs/vision.md, "Which llama.cpp runs which file").
PROJECTORS = ("minicpmv4_6", "minicpmv4_7")
SLOT_OPTION = {"target": "MODEL", "mmproj": "--mmproj", "draft": "--model-draft"}
# gguf-split's naming (llama.cpp's llama_split_path: "%s-%05d-of-%05d.gguf")
SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def without_split_suffix(name: str) -> str:
    """A split model's file name without its -00001-of-0000N part (`m-00001-of-00002.gguf` → `m.gguf`)."""
    m = SPLIT_RE.match(name)
    return f"{m['stem']}.gguf" if m else name


@dataclass(frozen=True)
class Artifact:
    role: str
    path: Path  # what llama.cpp is given: the file, or a split model's first part
    bytes: int  # of every part
    sha256: str | None = None  # from the manifest (None for files found otherwise)
    type: str | None = None  # from the manifest
    parts: tuple[Path, ...] = ()  # a split model's parts in order; () for a single file

    @property
    def files(self) -> tuple[Path, ...]:
        return self.parts or (self.path,)


@dataclass(frozen=True)
class Artifacts:
    out_dir: Path  # the folder the model came from (logs go here when it is writable)
    files: dict  # role -> Artifact
    source: str = "manifest"  # "manifest" | "folder" | "files" | the hub spec
    notes: tuple[str, ...] = field(default_factory=tuple)  # how roles were found (one line each, for the log)

    @property
    def target(self) -> Artifact:
        return self.files["target"]

    @property
    def mmproj(self) -> Artifact | None:
        return self.files.get("mmproj")

    @property
    def draft(self) -> Artifact | None:
        return self.files.get("draft")

    def missing(self, role: str) -> str:
        """Why there is no file for `role`, for messages: 'OUT/manifest.json lists no draft', ..."""
        what = {"mmproj": "projector (mmproj)", "draft": "draft (dflash)", "target": "text model"}[role]
        if self.source == "manifest":
            return f"{self.out_dir / MANIFEST} lists no {what}"
        if self.source == "folder":
            return f"the folder {self.out_dir} holds no {what}"
        if self.source == "files":
            return f"no {what} was named ({SLOT_OPTION[role]} FILE)"
        return f"{self.source} has no {what}"


def home_of(spec: "str | Path | ModelSpec") -> Path | None:
    """The folder a model's own outputs go in (the server log, bench results): OUT_DIR or the folder of GGUFs, the
    folder of MODEL.gguf; None for a hub spec (its files live in the HF cache, not ours to write into)."""
    model = ModelSpec.of(spec).model
    if model.startswith(("hf://", "ms://")):
        return None
    path = Path(model)
    return path if path.is_dir() else path.parent


@dataclass(frozen=True)
class ModelSpec:
    """What the user named: MODEL (an OUT_DIR, a folder of GGUFs, a .gguf file or a hub spec) and, optionally,
    the projector and draft files that go with it (`--mmproj FILE`, `--model-draft FILE`)."""

    model: str
    mmproj: str | None = None
    draft: str | None = None

    @classmethod
    def of(cls, spec: "str | Path | ModelSpec") -> "ModelSpec":
        return spec if isinstance(spec, ModelSpec) else cls(str(spec))


# --- one file: what its metadata says it is -----------------------------------------------------------------------

@dataclass(frozen=True)
class Probe:
    path: Path
    role: str | None  # None: not a file of this model (`why` says what it is)
    arch: str | None
    why: str
    header: GGUFHeader | None = None
    claims: str | None = None  # the role its metadata claims when it cannot play it (a projector of another type)


def probe(path: Path) -> Probe:
    """Read one GGUF's header and say which role it can play. Bad files raise GGUFFileError (one line)."""
    h = read_header(path)
    kv = h.kv
    split_no = kv.get("split.no")
    if isinstance(split_no, int) and split_no > 0:
        return Probe(path, None, None, f"part {split_no + 1} of a split model", h)
    arch = kv.get("general.architecture")
    arch = arch if isinstance(arch, str) else None
    role = role_of(kv)
    if role == "imatrix":
        return Probe(path, None, None, "an importance matrix", h)
    if role == "target" and arch != TARGET_ARCH:
        return Probe(path, None, arch, f"architecture {arch!r}, not a MiniCPM-V 4.7 file "
                                       f"(expected {', '.join([TARGET_ARCH, *ROLE_OF_ARCH])})", h)
    if role == "mmproj":
        proj = projector_type(kv)
        if proj not in PROJECTORS:
            return Probe(path, None, arch, f"a projector of type {proj!r}, not MiniCPM-V 4.7's "
                                           f"({' or '.join(PROJECTORS)})", h, claims="mmproj")
        if kv.get("clip.has_vision_encoder") is False:
            return Probe(path, None, arch, "a projector without a vision encoder", h, claims="mmproj")
    return Probe(path, role, arch, role, h)


def projector_type(kv: dict) -> str | None:
    """The mmproj's projector type: the loader reads `clip.projector_type`, else `clip.vision.projector_type`."""
    for key in ("clip.projector_type", "clip.vision.projector_type"):
        if isinstance(kv.get(key), str):
            return kv[key]
    return None


def split_parts(first: Path, kv: dict) -> tuple[Path, ...]:
    """Every part of a split model, from its first part: named as gguf-split names them, all present, each saying
    it is part i of n. () for a file that is not split."""
    count = kv.get("split.count")
    m = SPLIT_RE.match(first.name)
    if count is None and m is None:
        return ()
    if m is None or not isinstance(count, int) or count < 1 or int(m["count"]) != count or int(m["no"]) != 1:
        raise GGUFFileError(f"{first}: a split model's first part must be named NAME-00001-of-NNNNN.gguf with "
                            f"split.count = NNNNN, found split.count {count!r}")
    parts = [first.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise GGUFFileError(f"{first}: split model of {count} parts; missing {', '.join(missing[:3])}"
                            + (" ..." if len(missing) > 3 else ""))
    for i, p in enumerate(parts[1:], start=1):
        no = read_header(p).kv.get("split.no")
        if no != i:
            raise GGUFFileError(f"{p}: expected split part {i + 1} of {count} (split.no {i}), found split.no {no!r}")
    return tuple(parts)


def _artifact(pr: Probe, role: str) -> Artifact:
    parts = split_parts(pr.path, pr.header.kv if pr.header else {})
    files = parts or (pr.path,)
    return Artifact(role, pr.path, sum(p.stat().st_size for p in files), None, None, parts)


def _expect(pr: Probe, role: str, option: str) -> Artifact:
    if pr.role != role:
        found = _ROLE_WORDS[pr.role] if pr.role else pr.why
        raise GGUFFileError(f"{option} {pr.path}: expected {_ROLE_WORDS[role]}, found {found}")
    return _artifact(pr, role)


_ROLE_WORDS = {"target": f"a text model ({TARGET_ARCH})", "mmproj": "a projector (clip, MiniCPM-V 4.7 vision)",
               "draft": "a DSpark draft (dflash)"}


# --- the ways in ---------------------------------------------------------------------------------------------------

def load_artifacts(spec: "str | Path | ModelSpec", verify_hashes: bool = False, *, want_draft: bool = False,
                   progress: bool = False) -> Artifacts:
    """The model files `spec` names, each role checked. `want_draft`: a hub spec also fetches the repo's draft."""
    spec = ModelSpec.of(spec)
    model = spec.model
    from ggufbridge.checkpoint import hub_gguf

    hspec = hub_gguf.parse_gguf_spec(model)
    if hspec is not None:
        fetched = hub_gguf.fetch_gguf(hspec, draft=want_draft and spec.draft is None, mmproj=spec.mmproj is None,
                                      progress=progress)
        return _from_files(ModelSpec(str(fetched.target), spec.mmproj or _opt(fetched.mmproj),
                                     spec.draft or _opt(fetched.draft)),
                           source=str(hspec), notes=fetched.notes)
    path = Path(model)
    if path.is_dir():
        if (path / MANIFEST).is_file():
            art = _from_manifest(path, verify_hashes)
        else:
            art = _from_folder(path, given={r for r, f in (("mmproj", spec.mmproj), ("draft", spec.draft)) if f})
        if spec.mmproj or spec.draft:  # explicit files replace the folder's
            files = dict(art.files)
            if spec.mmproj:
                files["mmproj"] = _expect(probe(Path(spec.mmproj)), "mmproj", "--mmproj")
            if spec.draft:
                files["draft"] = _expect(probe(Path(spec.draft)), "draft", "--model-draft")
            art = Artifacts(art.out_dir, files, art.source, art.notes)
        return art
    if not path.exists():
        raise ManifestError(f"{model}: no such file or folder (expected an OUT_DIR, a folder of GGUFs, a .gguf file "
                            f"or hf://ORG/REPO[:QUANT])")
    return _from_files(spec, source="files")


def _opt(p: Path | None) -> str | None:
    return str(p) if p is not None else None


def _from_manifest(out: Path, verify_hashes: bool) -> Artifacts:
    manifest = read_manifest(out)
    files = {}
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
        files[a.role] = Artifact(a.role, a.path, a.bytes, a.sha256, a.type)
    return Artifacts(out, files, "manifest")


def _from_folder(folder: Path, given: set[str] = frozenset()) -> Artifacts:
    """Roles from each file's metadata. Files that are not this model's (an imatrix, another architecture, later
    parts of a split model) are passed over with a note; two candidates for one role are refused, unless the role
    is `given` (named explicitly with its option)."""
    ggufs = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    if not ggufs:
        raise ManifestError(f"{folder}: no {MANIFEST} and no .gguf files (expected a folder written by `ggufbridge "
                            f"convert`, or one holding the GGUF files of MiniCPM-V 4.7)")
    found: dict[str, list[Probe]] = {r: [] for r in ROLES}
    notes = []
    for p in ggufs:
        pr = probe(p)
        if pr.role is None and pr.claims == "mmproj" and "mmproj" not in given:
            # a folder's projector is this model's or the folder is refused (docs/gguf-files.md): passing it over
            # would start the model text-only and answer every image request with an error
            raise ManifestError(f"{folder}: {p.name} is {pr.why}: refused (remove it, or name this model's "
                                f"projector with --mmproj FILE)")
        if pr.role is None:
            notes.append(f"{p.name}: passed over ({pr.why})")
        else:
            found[pr.role].append(pr)
    files = {}
    for role in ROLES:
        cands = found[role]
        if role in given:
            continue
        if len(cands) > 1:
            names = ", ".join(c.path.name for c in cands)
            pick = (f"name the model file (serve {folder}/FILE.gguf --mmproj ... --draft ...)" if role == "target"
                    else f"name one with {SLOT_OPTION[role]} FILE")
            raise ManifestError(f"{folder}: {len(cands)} candidates for the {role} ({names}); {pick}")
        if cands:
            files[role] = _artifact(cands[0], role)
            notes.append(f"{role}: {cands[0].path.name} (general.architecture {cands[0].arch})")
    for n in notes:
        log.info("%s: %s", folder, n)  # `-v` shows how each role was found
    if "target" not in files:
        other = "; ".join(notes) or "nothing usable"
        raise ManifestError(f"{folder}: no {MANIFEST} and no {TARGET_ARCH} text model among its .gguf files ({other})")
    return Artifacts(folder, files, "folder", tuple(notes))


def _from_files(spec: ModelSpec, *, source: str, notes: tuple[str, ...] = ()) -> Artifacts:
    target = Path(spec.model)
    files = {"target": _expect(probe(target), "target", "MODEL" if source == "files" else source)}
    if spec.mmproj:
        files["mmproj"] = _expect(probe(Path(spec.mmproj)), "mmproj", "--mmproj")
    if spec.draft:
        files["draft"] = _expect(probe(Path(spec.draft)), "draft", "--model-draft")
    notes = list(notes)
    if source == "files":  # MODEL.gguf: what lies beside it counts as it would in its folder
        named = [f"{r}: {files[r].path}" for r in ("mmproj", "draft") if r in files]
        beside, said = _beside(target, [r for r in ("mmproj", "draft") if r not in files])
        files.update(beside)
        notes += said
        for line in [f"model: {target}", *named, *said]:  # which files run, said without -v
            log.info("%s", line)
    return Artifacts(target.parent, files, source, tuple(notes))


def _beside(target: Path, roles: list[str]) -> tuple[dict, list[str]]:
    """The projector and the draft beside MODEL.gguf, as its folder would give them (`_from_folder`): the one file
    of each role in `roles`. Two candidates pick neither (the line says which to name); a file that cannot be read
    is passed over, as it is not the one the user named. Returns (role -> Artifact, lines for the user)."""
    found: dict[str, list[Probe]] = {r: [] for r in roles}
    for p in sorted(target.parent.iterdir()) if roles else ():
        if p.suffix.lower() != ".gguf" or not p.is_file() or p.resolve() == target.resolve():
            continue
        try:
            pr = probe(p)
        except GGUFFileError as e:
            log.debug("%s: passed over (%s)", p, e)
            continue
        if pr.role in found:
            found[pr.role].append(pr)
    files, said = {}, []
    for role in roles:
        cands = found[role]
        if len(cands) == 1:
            try:
                files[role] = _artifact(cands[0], role)
            except GGUFFileError as e:
                said.append(f"{role}: {cands[0].path.name} beside the model passed over ({e})")
            else:
                said.append(f"{role}: {cands[0].path.name} (beside the model)")
        elif cands:
            said.append(f"{role}: none used, {len(cands)} candidates beside the model "
                        f"({', '.join(c.path.name for c in cands)}); name one with {SLOT_OPTION[role]} FILE")
    if "mmproj" in roles and "mmproj" not in files:
        said.append(f"text-only: no projector (mmproj) beside {target.name}; images and video need --mmproj FILE")
    return files, said


__all__ = ["ROLES", "Artifact", "Artifacts", "ModelSpec", "load_artifacts", "probe", "projector_type"]
