"""GGUF repositories on Hugging Face, named as llama.cpp's `-hf` names them: `hf://ORG/REPO[@REV][:QUANT]`.

What `serve` / `run` / `plan` / `bench` fetch for such a spec (`fetch_gguf`):

- the text model: the `.gguf` file(s) whose name carries QUANT as a token (`...-Q4_K_M.gguf`,
  `Q4_K_M/...-00001-of-00003.gguf`: every part of a split model); without QUANT, the repo's only model, else its
  Q4_K_M (llama.cpp's default), else an error listing the choices;
- the projector beside it: a file with `mmproj` in its name (the one with the same QUANT, else F16, BF16, F32,
  Q8_0 in that order);
- with `--draft`: a file with `dspark`, `dflash` or `draft` in its name, chosen the same way.

The choice is made from the repo's file list (names only); what each file is gets checked afterwards from its own
metadata (runtime.artifacts). Downloads go through checkpoint.hub: the HF cache, resumable, sha256-checked. With
HF_HUB_OFFLINE=1 or an unreachable hub, the list comes from a cached snapshot of the repo.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ggufbridge.checkpoint import hub
from ggufbridge.errors import HubError

log = logging.getLogger(__name__)

DEFAULT_QUANT = "Q4_K_M"  # what llama.cpp's -hf takes when the spec names none
PREFERRED_TYPES = ("F16", "BF16", "F32", "Q8_0")  # projector/draft when none carries the model's quant
_SPEC = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[^\s@:]+))?(?::(?P<quant>[A-Za-z0-9_.-]+))?/?")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
ROLE_WORDS = {"mmproj": ("mmproj",), "draft": ("dspark", "dflash", "draft")}


@dataclass(frozen=True)
class GGUFSpec:
    repo_id: str
    revision: str | None = None
    quant: str | None = None

    def __str__(self) -> str:
        return (f"hf://{self.repo_id}" + (f"@{self.revision}" if self.revision else "")
                + (f":{self.quant}" if self.quant else ""))

    @property
    def hub_spec(self) -> hub.HubSpec:
        """What the shared download machinery (checkpoint.hub) takes; its messages name the whole spec, :QUANT
        included (`hf://ORG/REPO:Q4_K_M: repository not found`), as the user wrote it."""
        return _NamedHubSpec("hf", self.repo_id, self.revision, str(self))


@dataclass(frozen=True)
class _NamedHubSpec(hub.HubSpec):
    shown: str = ""

    def __str__(self) -> str:
        return self.shown or super().__str__()


@dataclass(frozen=True)
class Fetched:
    target: Path  # the model file (a split model's first part)
    mmproj: Path | None
    draft: Path | None
    notes: tuple[str, ...]


def parse_gguf_spec(spec) -> GGUFSpec | None:
    """`hf://ORG/REPO[@REV][:QUANT]` → GGUFSpec; None for anything that is not an `hf://` spec."""
    text = str(spec)
    if not text.startswith("hf://"):
        if text.startswith("ms://"):
            raise HubError(f"{text}: GGUF repositories are fetched from Hugging Face only (hf://ORG/REPO[:QUANT])")
        return None
    m = _SPEC.fullmatch(text.removeprefix("hf://"))
    if m is None:
        raise HubError(f"{text}: expected hf://ORG/REPO[@REVISION][:QUANT], e.g. hf://ORG/REPO:Q4_K_M")
    return GGUFSpec(m["repo"], m["rev"], m["quant"])


# --- choosing files from the repo's list -------------------------------------------------------------------------

def _role_by_name(path: str) -> str | None:
    name = PurePosixPath(path).name.lower()
    if not name.endswith(".gguf") or "imatrix" in name:
        return None
    for role, words in ROLE_WORDS.items():
        if any(w in name for w in words):
            return role
    return "target"


def _group(path: str) -> str:
    """A split model's parts share one group (its path without the -0000i-of-0000n suffix)."""
    return _SPLIT.sub("", path)


def _has_token(path: str, tag: str) -> bool:
    """QUANT as a whole token of the path: after start, '-', '_', '.' or '/', before end, '-', '.' or '/'."""
    stem = _SPLIT.sub("", path)
    stem = stem[:-5] if stem.lower().endswith(".gguf") else stem
    return re.search(r"(?:^|[-_./])" + re.escape(tag) + r"(?=$|[-./])", stem, re.IGNORECASE) is not None


def choose(files: list[str], spec: GGUFSpec, *, draft: bool, mmproj: bool = True) -> dict[str, list[str]]:
    """role → the repo paths to fetch (a split model: all its parts, in order). Errors name the candidates."""
    by_role: dict[str, dict[str, list[str]]] = {"target": {}, "mmproj": {}, "draft": {}}
    for f in sorted(files):
        if PurePosixPath(f).is_absolute() or ".." in PurePosixPath(f).parts:
            continue  # never a path outside the snapshot, whatever the hub lists
        role = _role_by_name(f)
        if role:
            by_role[role].setdefault(_group(f), []).append(f)
    targets = by_role["target"]
    if not targets:
        raise HubError(f"{spec}: the repository holds no GGUF model file")
    if spec.quant:
        hits = [g for g in targets if _has_token(g, spec.quant)]
        if not hits:
            raise HubError(f"{spec}: no GGUF file for {spec.quant}; the repository has {_listing(targets)}")
    else:
        hits = list(targets) if len(targets) == 1 else [g for g in targets if _has_token(g, DEFAULT_QUANT)]
        if not hits:
            raise HubError(f"{spec}: {len(targets)} GGUF models and no {DEFAULT_QUANT}; name one with :QUANT "
                           f"({_listing(targets)})")
    if len(hits) > 1:
        raise HubError(f"{spec}: {len(hits)} files match; name one exactly ({_listing({g: [] for g in hits})})")
    out = {"target": _complete(targets[hits[0]], spec)}
    quant = spec.quant or _quant_of(hits[0])
    mm = _pick(by_role["mmproj"], quant, spec, "projector", required=False) if mmproj else None
    if mm:
        out["mmproj"] = mm
    if draft:
        out["draft"] = _pick(by_role["draft"], quant, spec, "draft", required=True)
    return out


def _quant_of(path: str) -> str | None:
    m = re.search(r"[-_.]((?:I?Q\d\w*?|B?F\d+))(?:-\d{5}-of-\d{5})?\.gguf$", path, re.IGNORECASE)
    return m.group(1) if m else None


def _pick(groups: dict[str, list[str]], quant: str | None, spec: GGUFSpec, what: str, *, required: bool):
    if not groups:
        if required:
            raise HubError(f"{spec}: --draft: the repository has no draft file (a name with "
                           f"{', '.join(ROLE_WORDS['draft'])}); pass --model-draft FILE")
        return None
    if len(groups) == 1:
        return _complete(next(iter(groups.values())), spec)
    for tag in ([quant] if quant else []) + list(PREFERRED_TYPES):
        hits = [g for g in groups if _has_token(g, tag)]
        if len(hits) == 1:
            return _complete(groups[hits[0]], spec)
        if len(hits) > 1:
            break
    raise HubError(f"{spec}: {len(groups)} {what} files and none preferred ({_listing(groups)}); download the "
                   f"one you want and pass it with --{'mmproj' if what == 'projector' else 'draft'} FILE")


def _complete(parts: list[str], spec: GGUFSpec) -> list[str]:
    """A split model's parts must all be listed: 1..n of n."""
    m = [_SPLIT.search(p) for p in parts]
    if not any(m):
        if len(parts) != 1:
            raise HubError(f"{spec}: several files named {parts[0]}")
        return parts
    count = int(m[0].group(2))
    have = sorted(int(x.group(1)) for x in m if x)
    if have != list(range(1, count + 1)) or not all(m) or any(int(x.group(2)) != count for x in m):
        raise HubError(f"{spec}: split model {_group(parts[0])} lists parts {have} of {count}")
    return sorted(parts)


def _listing(groups) -> str:
    names = [PurePosixPath(g).name for g in groups]
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


# --- fetching ----------------------------------------------------------------------------------------------------

def _repo_files(spec: GGUFSpec) -> list[str]:
    """The repo's file list at the revision; from a cached snapshot when offline or unreachable."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}
    error = None
    if not offline:
        try:
            import huggingface_hub as hh
        except ImportError:
            raise HubError(f"{spec}: needs the huggingface_hub package (pip install huggingface_hub)") from None
        api = hh.HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
        try:
            return [f.path for f in api.list_repo_tree(spec.repo_id, recursive=True, revision=spec.revision or "main")
                    if type(f).__name__ == "RepoFile"]
        except Exception as e:
            if not hub._is_client_error(e):
                raise
            error = e
            if not hub._is_connection_error(e):
                raise HubError(hub._hf_message(spec.hub_spec, e, hub.hf_cache_dir(), offline)) from None
    snap = hub.cached_hf_snapshot(spec.repo_id, spec.revision)
    if snap is None:
        why = "HF_HUB_OFFLINE is set" if offline else f"the hub cannot be reached ({hub._first_line(error)})"
        raise HubError(f"{spec}: not in the HF cache at {hub.hf_cache_dir()}, and {why}")
    log.info("%s: listing the cached snapshot %s", spec, snap)
    return [p.relative_to(snap).as_posix() for p in snap.rglob("*.gguf")]


def fetch_gguf(spec: GGUFSpec, *, draft: bool = False, mmproj: bool = True, progress: bool = False) -> Fetched:
    """Choose the files of `spec` and download them (or find them in the cache) → their local paths. `mmproj` /
    `draft`: whether to fetch the repo's projector / draft (not when the user names their own)."""
    chosen = choose(_repo_files(spec), spec, draft=draft, mmproj=mmproj)
    paths = [p for files in chosen.values() for p in files]
    snap = hub._hf_download(spec.hub_spec, progress, tuple(glob.escape(p) for p in paths))
    local = {}
    for role, files in chosen.items():
        for f in files:  # `choose` kept only relative paths without '..': all inside the snapshot
            if not (snap / f).is_file():
                raise HubError(f"{spec}: {f} was not downloaded")
        local[role] = snap / files[0]
    notes = tuple(f"{role}: {spec.repo_id}/{files[0]}" + (f" (+{len(files) - 1} parts)" if len(files) > 1 else "")
                  for role, files in chosen.items())
    for n in notes:
        log.info("%s", n)
    return Fetched(local["target"], local.get("mmproj"), local.get("draft"), notes)


__all__ = ["GGUFSpec", "Fetched", "parse_gguf_spec", "choose", "fetch_gguf"]
