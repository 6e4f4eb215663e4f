"""Hub specs and downloads: `hf://[ORG/]NAME[@REV]` (Hugging Face) and `ms://ORG/NAME[@REV]` (ModelScope).

Downloads go through each hub's own client library into its standard cache (HF_HUB_CACHE or HF_HOME/hub;
MODELSCOPE_CACHE), with its token (HF_TOKEN or the stored login; MODELSCOPE_API_TOKEN) and endpoint settings
(HF_ENDPOINT; MODELSCOPE_ENDPOINT), and fetch only the files conversion reads (ALLOW_PATTERNS). Every failure
becomes a HubError with one line.

huggingface_hub (2.x) checks only the size of a plain-HTTP download and deletes the partial file when a call fails,
so the LFS files (the shards) are fetched here first, with its own `http_get`, into `blobs/<sha256>.incomplete`:
the next call resumes it with a Range request, and it takes its final name only once its sha256 matches the hub's.
`snapshot_download` then links those blobs into the snapshot and fetches the small files. modelscope resumes
from `.incomplete` files and checks sha256 itself.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ggufbridge.errors import HubError
from ggufbridge.files import sha256_file

log = logging.getLogger(__name__)

HUBS = {"hf": "Hugging Face", "ms": "ModelScope"}

# What conversion reads from a model folder (and transformers, for the hf: reference): configs, tokenizer, chat
# template, the model card (license, base_model), the safetensors shards and their index. No pickles, ONNX, GGUF.
ALLOW_PATTERNS = (
    "config.json", "generation_config.json", "preprocessor_config.json", "processor_config.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "chat_template.jinja", "chat_template.json", "README.md",
    "model.safetensors.index.json", "*.safetensors",
)

_BODY = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*(?:/[\w.-]+)?)(?:@(?P<rev>[^\s@]+))?/?")
# errors raised by the hub clients and their HTTP stacks: turned into HubError; anything else is a bug
_CLIENT_MODULES = ("huggingface_hub", "modelscope", "modelscope_hub", "httpx2", "httpx", "requests", "urllib3")


@dataclass(frozen=True)
class HubSpec:
    hub: str  # "hf" | "ms"
    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return f"{self.hub}://{self.repo_id}" + (f"@{self.revision}" if self.revision else "")


def parse_spec(spec) -> HubSpec | None:
    """`hf://ORG/NAME[@REV]` / `ms://ORG/NAME[@REV]` → HubSpec; None for anything else (folders, cached repo ids)."""
    hub, sep, rest = str(spec).partition("://")
    if not sep or hub not in HUBS:
        return None
    m = _BODY.fullmatch(rest)
    if m is None or (hub == "ms" and "/" not in m["repo"]):
        raise HubError(f"{spec}: expected {hub}://ORG/NAME[@REVISION]")
    return HubSpec(hub, m["repo"], m["rev"])


def pinned(spec: HubSpec, revision: str | None) -> HubSpec:
    """`spec` with `revision` (from --revision) applied; both given and different is an error."""
    if revision is None or revision == spec.revision:
        return spec
    if spec.revision is not None:
        raise HubError(f"{spec}: names revision {spec.revision}, but --revision says {revision}")
    return HubSpec(spec.hub, spec.repo_id, revision)


def download(spec: HubSpec, *, progress: bool = False) -> Path:
    """Download (or find in the cache) the files of `spec` that conversion reads → the local snapshot folder."""
    path = _hf_download(spec, progress) if spec.hub == "hf" else _ms_download(spec)
    log.info("%s: %s", spec, path)
    return path


# -- Hugging Face ---------------------------------------------------------------------------------------------------

def hf_cache_dir() -> Path:
    """The HF hub cache, found as huggingface_hub finds it, but from the environment at call time (the library
    reads it once, at import)."""
    env = os.environ
    home = env.get("HF_HOME") or Path(env.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or Path(home) / "hub"
    return Path(os.path.expandvars(str(cache))).expanduser()


def cached_hf_snapshot(repo_id: str, revision: str | None = None) -> Path | None:
    """The snapshot of `repo_id` in the HF cache for `revision` (a branch, tag or commit; default: main, else the
    newest snapshot), without any network access."""
    repo = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    snaps = repo / "snapshots"
    ref = repo / "refs" / (revision or "main")
    commit = ref.read_text().strip() if ref.is_file() else revision
    if commit and (snaps / commit).is_dir():
        return snaps / commit
    if revision is None and snaps.is_dir():
        found = sorted(p for p in snaps.iterdir() if p.is_dir())
        return found[-1] if found else None
    return None


def _hf_download(spec: HubSpec, progress: bool, patterns: tuple[str, ...] = ALLOW_PATTERNS) -> Path:
    try:
        import huggingface_hub as hh
        from huggingface_hub import constants  # a submodule: not an attribute until imported
    except ImportError:
        raise HubError(f"{spec}: needs the huggingface_hub package (pip install huggingface_hub)") from None
    endpoint = os.environ.get("HF_ENDPOINT") or None  # read per call: the library reads it once, at import
    cache = hf_cache_dir()
    revision = spec.revision or "main"
    offline = constants.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}
    try:
        if not offline:
            _hf_fetch_lfs(spec, revision, cache, endpoint, progress, patterns)
        # what is left is small (configs, tokenizer): no second set of bars beside the shards' one
        path = hh.snapshot_download(
            spec.repo_id, revision=revision, cache_dir=cache, endpoint=endpoint, allow_patterns=list(patterns),
            local_files_only=offline, tqdm_class=functools.partial(tqdm, disable=True))
    except Exception as e:
        if not _is_client_error(e):
            raise
        raise HubError(_hf_message(spec, e, cache, offline)) from None
    return Path(path)


def _hf_fetch_lfs(spec: HubSpec, revision: str, cache: Path, endpoint: str | None, progress: bool,
                  patterns: tuple[str, ...] = ALLOW_PATTERNS) -> None:
    """Fetch the LFS files among `patterns` into the cache's blobs/, resumably and sha256-checked."""
    import huggingface_hub as hh
    from huggingface_hub.file_download import repo_folder_name
    from huggingface_hub.utils import build_hf_headers, filter_repo_objects

    api = hh.HfApi(endpoint=endpoint)
    try:
        commit = api.repo_info(spec.repo_id, revision=revision).sha
        lfs = {f.path: f for f in api.list_repo_tree(spec.repo_id, recursive=True, revision=commit)
               if getattr(f, "lfs", None) is not None}
    except Exception as e:
        if not _is_client_error(e):
            raise
        # Unreachable hub, unknown repo, no access...: snapshot_download repeats the call and applies the
        # library's own rules (fall back to a complete cached snapshot, or say why not).
        log.debug("%s: listing failed (%s); leaving it to snapshot_download", spec, e)
        return
    folder = repo_folder_name(repo_id=spec.repo_id, repo_type="model")
    blobs, locks = cache / folder / "blobs", cache / ".locks" / folder
    todo = [lfs[p] for p in filter_repo_objects(sorted(lfs), allow_patterns=list(patterns))
            if not (blobs / lfs[p].lfs.sha256).exists()]
    if not todo:
        return
    blobs.mkdir(parents=True, exist_ok=True)
    locks.mkdir(parents=True, exist_ok=True)
    have = sum(_size(blobs / f"{f.lfs.sha256}.incomplete") for f in todo)
    headers = build_hf_headers()  # HF_TOKEN or the stored login; dropped by the HTTP client on cross-host redirects
    with tqdm(total=sum(f.lfs.size for f in todo), initial=have, unit="B", unit_scale=True, unit_divisor=1024,
              desc=str(spec), disable=not progress) as bar:
        for f in todo:
            url = hh.hf_hub_url(spec.repo_id, f.path, revision=commit, endpoint=endpoint)
            _fetch_blob(url, blobs / f.lfs.sha256, f.lfs.size, headers, locks / f"{f.lfs.sha256}.lock", bar,
                        f"{spec}: {f.path}")


def _fetch_blob(url: str, blob: Path, size: int, headers: dict, lock: Path, bar, what: str) -> None:
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import WeakFileLock

    part = blob.with_name(blob.name + ".incomplete")
    with WeakFileLock(lock):  # the library's own lock for this blob
        if blob.exists():
            return
        done = _size(part)
        if done > size:  # not a prefix of this blob
            part.unlink()
            bar.update(-done)
            done = 0
        if done:
            log.info("%s: resuming at byte %d of %d", what, done, size)
        with open(part, "ab") as fh:
            http_get(url, fh, resume_size=done, headers=dict(headers), expected_size=size, displayed_filename=what,
                     tqdm_class=_Into(bar))
        digest = sha256_file(part)
        if digest != blob.name:
            part.unlink()
            raise HubError(f"{what}: checksum mismatch: the downloaded bytes have sha256 {digest[:16]}…, the hub "
                           f"announces {blob.name[:16]}… (discarded; run again)")
        os.replace(part, blob)


class _Into:
    """Stands in for http_get's tqdm class: counts its bytes on one shared bar."""

    def __init__(self, bar):
        self.bar = bar

    def __call__(self, *args, **kwargs):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        self.bar.update(n)


def _hf_message(spec: HubSpec, e: Exception, cache: Path, offline: bool) -> str:
    kinds = {c.__name__ for c in type(e).__mro__}
    if "GatedRepoError" in kinds:
        return f"{spec}: gated repository: accept its terms on the hub, then set HF_TOKEN"
    if "RepositoryNotFoundError" in kinds:
        return f"{spec}: repository not found (a private or gated one needs HF_TOKEN)"
    if "RevisionNotFoundError" in kinds:
        return f"{spec}: revision {spec.revision or 'main'} not found"
    if "LocalEntryNotFoundError" in kinds or "IncompleteSnapshotError" in kinds or "OfflineModeIsEnabled" in kinds:
        why = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached"
        return f"{spec}: not (completely) in the HF cache at {cache}, and {why}"
    if "EntryNotFoundError" in kinds or "RemoteEntryNotFoundError" in kinds:
        return f"{spec}: a file of the repository is missing on the hub ({_first_line(e)})"
    return f"{spec}: download failed: {_first_line(e)}"


# -- ModelScope -----------------------------------------------------------------------------------------------------

def _ms_download(spec: HubSpec) -> Path:
    try:
        from modelscope import snapshot_download
    except ImportError:
        raise HubError(f"{spec}: needs the modelscope package (pip install modelscope)") from None
    kwargs = dict(revision=spec.revision, allow_patterns=list(ALLOW_PATTERNS), **_ms_settings())
    try:
        return Path(snapshot_download(spec.repo_id, **kwargs))
    except Exception as e:
        if not _is_client_error(e):
            raise
        if _is_connection_error(e):  # offline: a snapshot already in MODELSCOPE_CACHE still serves
            try:
                return Path(snapshot_download(spec.repo_id, local_files_only=True, **kwargs))
            except Exception as cached:
                if not _is_client_error(cached):
                    raise
        raise HubError(_ms_message(spec, e)) from None


def _ms_settings() -> dict:
    """MODELSCOPE_CACHE, MODELSCOPE_ENDPOINT and MODELSCOPE_API_TOKEN as they are now: modelscope reads them into
    one configuration per process, at its first call."""
    env = os.environ
    settings = {"cache_dir": str(Path(env["MODELSCOPE_CACHE"]).expanduser())} if env.get("MODELSCOPE_CACHE") else {}
    if env.get("MODELSCOPE_ENDPOINT"):
        settings["endpoint"] = env["MODELSCOPE_ENDPOINT"]
    if "MODELSCOPE_API_TOKEN" in env:
        settings["token"] = env["MODELSCOPE_API_TOKEN"]
    return settings


def _ms_message(spec: HubSpec, e: Exception) -> str:
    text = _first_line(e)
    if _is_connection_error(e):
        return f"{spec}: the hub cannot be reached and no snapshot is in MODELSCOPE_CACHE ({text})"
    if "[404]" in text or "not found" in text.lower():
        return f"{spec}: not found ({text}; a private repository needs MODELSCOPE_API_TOKEN)"
    if "[401]" in text or "[403]" in text:
        return f"{spec}: access denied ({text}; set MODELSCOPE_API_TOKEN)"
    return f"{spec}: download failed: {text}"


# -- shared ---------------------------------------------------------------------------------------------------------

def _is_client_error(e: BaseException) -> bool:
    return isinstance(e, OSError) or any(c.__module__.split(".")[0] in _CLIENT_MODULES for c in type(e).__mro__)


def _is_connection_error(e: BaseException) -> bool:
    names = {c.__name__ for c in type(e).__mro__}
    return bool(names & {"ConnectionError", "ConnectError", "ConnectTimeout", "Timeout", "TimeoutException"})


def _first_line(e: BaseException) -> str:
    """The first non-empty line of an exception's text (client messages run to paragraphs)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = lines[0] if lines else type(e).__name__
    if text.endswith("Client Error.") and len(lines) > 1:  # huggingface_hub: "404 Client Error." + the reason
        text = f"{text} {lines[1]}"
    return text[:300]


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except FileNotFoundError:
        return 0

