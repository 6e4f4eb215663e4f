"""A fake model hub on 127.0.0.1: the file endpoints huggingface_hub and modelscope call, for repos built from
local folders, with a request log and injectable faults (cut transfers, a failing server, lying checksums)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

# Files stored through git-lfs on the hubs (sha256 oid, X-Linked-Etag); the others are plain git blobs.
LFS_SUFFIXES = (".safetensors", ".bin", ".onnx", ".png", ".gguf")


@dataclass
class Commit:
    sha: str
    files: dict[str, bytes]

    def oid(self, path: str) -> str:
        data = self.files[path]
        if self.is_lfs(path):
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    def is_lfs(self, path: str) -> bool:
        return path.endswith(LFS_SUFFIXES)


@dataclass
class Fault:
    """What the server does to GETs of one file: cut the body after `truncate` bytes for the first `times` GETs
    (then answer 503 for `then_fail` GETs), or serve bytes that differ from the announced checksum (`lie`)."""

    truncate: int | None = None
    times: int = 1
    then_fail: int = 0
    lie: bool = False


@dataclass
class Request:
    method: str
    path: str
    query: dict
    headers: dict


@dataclass
class FakeHub:
    repos: dict[str, dict[str, Commit]] = field(default_factory=dict)  # repo id -> ref or sha -> commit
    faults: dict[str, Fault] = field(default_factory=dict)  # file path -> fault
    log: list[Request] = field(default_factory=list)
    url: str = ""

    def add(self, repo_id: str, files: dict[str, bytes] | Path, *, refs=("main", "master")) -> str:
        """Publish `files` (or a folder's files) as a new commit of `repo_id`; `refs` point at it (the default
        branches: main on Hugging Face, master on ModelScope). → the commit sha."""
        if isinstance(files, Path):
            files = {p.relative_to(files).as_posix(): p.read_bytes() for p in sorted(files.rglob("*")) if p.is_file()}
        digest = hashlib.sha1(repo_id.encode())
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
        commit = Commit(digest.hexdigest(), dict(files))
        revs = self.repos.setdefault(repo_id, {})
        revs[commit.sha] = commit
        for r in refs:
            revs[r] = commit
        return commit.sha

    def requests(self, method: str | None = None, contains: str = "") -> list[Request]:
        return [r for r in self.log if (method is None or r.method == method) and contains in r.path]

    def gets_of(self, name: str) -> list[Request]:
        """Downloads of file `name` on either hub's file endpoint."""
        return [r for r in self.log if r.method == "GET" and (r.path.endswith("/" + name) or
                                                             r.query.get("FilePath") == [name])]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: FakeHub

    def log_message(self, *args):  # quiet: the hub keeps its own log
        pass

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_GET(self):
        self._dispatch("GET")

    def _dispatch(self, method: str) -> None:
        parts = urlsplit(self.path)
        path, query = unquote(parts.path), parse_qs(parts.query)
        self.hub.log.append(Request(method, path, query, {k.lower(): v for k, v in self.headers.items()}))
        for pattern, fn in _ROUTES:
            m = re.fullmatch(pattern, path)
            if m:
                return fn(self, method, query, *m.groups())
        self._error(404, "EntryNotFound", f"no route {path}")

    # -- responses ------------------------------------------------------------------------------------------
    def _json(self, obj, status: int = 200, headers: dict | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        self._json({"error": message, "Code": status, "Message": message, "Success": False}, status,
                   {"X-Error-Code": code, "X-Error-Message": message})

    def _commit(self, repo_id: str, rev: str) -> Commit | None:
        revs = self.hub.repos.get(repo_id)
        if revs is None:
            self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            return None
        commit = revs.get(rev)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return commit

    def _file(self, method: str, commit: Commit, name: str, extra: dict) -> None:
        if name not in commit.files:
            self._error(404, "EntryNotFound", f"{name} does not exist")
            return
        data, oid = commit.files[name], commit.oid(name)
        fault = self.hub.faults.get(name)
        if method == "GET" and fault is not None and fault.lie:
            data = bytes(b ^ 0xFF for b in data[:16]) + data[16:]  # same size, other bytes
        start = 0
        rng = self.headers.get("Range")
        if method == "GET" and rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            start = int(m.group(1)) if m else 0
        cut = None
        if method == "GET" and fault is not None and (fault.truncate is not None or fault.then_fail):
            if fault.times > 0:
                fault.times -= 1
                cut = fault.truncate
            elif fault.then_fail > 0:
                fault.then_fail -= 1
                self._error(503, "ServiceUnavailable", "the server went away")
                return
        self.send_response(206 if start else 200)
        headers = {"Content-Length": str(len(data) - start), "ETag": f'"{oid}"', "Accept-Ranges": "bytes", **extra}
        if commit.is_lfs(name):
            headers |= {"X-Linked-Etag": f'"{oid}"', "X-Linked-Size": str(len(data))}
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if method == "HEAD":
            return
        body = data[start:]
        if cut is not None:
            # announce the full length, send part of it, then drop the connection
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(body)

    # -- Hugging Face -----------------------------------------------------------------------------------------
    def hf_info(self, method, query, repo_id, rev):
        commit = self._commit(repo_id, rev)
        if commit:
            self._json({"id": repo_id, "modelId": repo_id, "sha": commit.sha, "private": False,
                        "siblings": [{"rfilename": n} for n in sorted(commit.files)]})

    def hf_tree(self, method, query, repo_id, rev, sub):
        commit = self._commit(repo_id, rev)
        if not commit:
            return
        entries = []
        for name in sorted(commit.files):
            e = {"type": "file", "path": name, "size": len(commit.files[name]), "oid": commit.oid(name)}
            if commit.is_lfs(name):
                e["lfs"] = {"oid": commit.oid(name), "size": len(commit.files[name]), "pointerSize": 134}
            entries.append(e)
        self._json(entries)

    def hf_resolve(self, method, query, repo_id, rev, name):
        commit = self._commit(repo_id, rev)
        if commit:
            self._file(method, commit, name, {"X-Repo-Commit": commit.sha})

    # -- ModelScope -------------------------------------------------------------------------------------------
    def ms_files(self, method, query, repo_id):
        commit = self._commit(repo_id, query.get("Revision", ["master"])[0])
        if not commit:
            return
        files = [{"Path": n, "Name": n.rsplit("/", 1)[-1], "Type": "blob", "Size": len(commit.files[n]),
                  "Sha256": hashlib.sha256(commit.files[n]).hexdigest(), "Revision": commit.sha}
                 for n in sorted(commit.files)]
        self._json({"Code": 200, "Data": {"Files": files}, "Success": True})

    def ms_file(self, method, query, repo_id):
        commit = self._commit(repo_id, query.get("Revision", ["master"])[0])
        if commit:
            self._file(method, commit, query.get("FilePath", [""])[0], {})


_ROUTES = [
    (r"/api/models/([^/]+/[^/]+|[^/]+)/revision/(.+)", _Handler.hf_info),
    (r"/api/models/([^/]+/[^/]+|[^/]+)/tree/([^/]+)(/.*)?", _Handler.hf_tree),
    (r"/([^/]+/[^/]+|[^/]+)/resolve/([^/]+)/(.+)", _Handler.hf_resolve),
    (r"/api/v1/models/([^/]+/[^/]+)/repo/files", _Handler.ms_files),
    (r"/api/v1/models/([^/]+/[^/]+)/repo", _Handler.ms_file),
]


class HubServer:
    """`with HubServer() as hub:` a FakeHub served on 127.0.0.1:<free port>, at hub.url."""

    def __init__(self):
        self.hub = FakeHub()
        handler = type("Handler", (_Handler,), {"hub": self.hub})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.hub.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self.hub

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        return False
