"""Find the llama.cpp runtime ggufbridge launches, and check that it can run MiniCPM-V 4.7.

Order: an explicit `--llama-bin DIR` (a user's own build), then `$LLAMA_CPP_BIN`, then the cached build
that native/build_runtime.sh (`ggufbridge build-runtime`) writes to
`${GGUFBRIDGE_CACHE:-~/.cache/ggufbridge}/llama.cpp-VERSION-{cuda,cpu}-pHASH` for this package's patch series (CUDA
preferred when both exist; each variant's default parts first, then the other choice: patches.build_series), except
that a cached build the in-process bindings are bound to (their llama_cpp/lib links, build_runtime.sh --python)
comes first: after `build-runtime --perf` on a CPU the tools and the bindings are then the same build.
Every candidate is validated the same way by `check()`.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path


from ggufbridge.errors import RuntimeNotFound
from ggufbridge.files import cache_dir
from ggufbridge.ggufio import names
from ggufbridge.runtime import patches


def read_pin() -> dict[str, str]:
    """The KEY=VALUE lines of ggufbridge/runtime/llama_cpp.pin, the file scripts/build_runtime.sh sources."""
    text = resources.files("ggufbridge").joinpath("runtime", "llama_cpp.pin").read_text()
    pairs = (ln.split("=", 1) for ln in text.splitlines() if ln.strip() and not ln.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


_PIN = read_pin()
RUNTIME_VERSION = _PIN["LLAMA_CPP_PYTHON_VERSION"]  # the llama-cpp-python release whose vendored tree we build
PINNED_COMMIT = _PIN["LLAMA_CPP_COMMIT"]
VARIANTS = ("cuda", "cpu")  # preference order for the cached build
TOOLS = ("llama-server", "llama-cli", "llama-mtmd-cli", "llama-quantize", "llama-imatrix", "llama-perplexity",
         "ggml-rpc-server")
BUILD_HINT = "build it with `ggufbridge build-runtime` (it runs build_runtime.sh; --cuda for a GPU build)"

# A C string that only a llama-server with its chat page embedded holds: the asset table the tree's
# scripts/ui-assets.cmake generates names every file of the page, and server-http.cpp names this one only where
# assets were embedded (LLAMA_UI_HAS_ASSETS). A shared build keeps the server (and the page) in
# libllama-server-impl, a static one in llama-server. scripts/build_runtime.sh embeds the page when npm is there.
PAGE_MARKER = "manifest.webmanifest"
SERVER_LIB = "libllama-server-impl"
PAGE_HINT = "install Node.js 20+ with npm and re-run scripts/setup.sh (scripts/build_ui.sh builds the page)"

# backend name -> library file stem that a shared build ships when the backend was compiled in
BACKEND_LIBS = {
    "cpu": "libggml-cpu", "cuda": "libggml-cuda", "rpc": "libggml-rpc", "metal": "libggml-metal",
    "vulkan": "libggml-vulkan", "hip": "libggml-hip", "sycl": "libggml-sycl",
}


@dataclass(frozen=True)
class Capability:
    """Something the runtime must know, and how to look for it.

    kind "lib-string": the NUL-terminated name is in the shared library's string table (libllama keeps its
    architecture names and libmtmd its projector names as C strings: that is how the loaders match the
    `general.architecture` / `clip.projector_type` values of a GGUF). kind "help": the word appears in the
    tool's --help output (the argument parser lists every accepted --spec-type value there).
    """

    name: str
    kind: str
    where: str  # library stem (lib-string) or tool name (help)
    needle: str
    fix: str


CAPABILITIES = (
    Capability("arch qwen35moe", "lib-string", "libllama", "qwen35moe",
               "the runtime predates Qwen3.5-MoE support: " + BUILD_HINT),
    Capability("arch dflash", "lib-string", "libllama", "dflash",
               "the runtime has no DFlash/DSpark draft support: " + BUILD_HINT),
    Capability("spec-type draft-dspark", "help", "llama-server", "draft-dspark",
               "llama-server does not accept --spec-type draft-dspark: " + BUILD_HINT),
    Capability("projector minicpmv4_6", "lib-string", "libmtmd", "minicpmv4_6",
               "libmtmd lacks the MiniCPM-V 4.6 projector (vision will not load): " + BUILD_HINT),
)


@dataclass
class Runtime:
    """One llama.cpp build: where it is and what it claims to be (validated by `check`)."""

    bin_dir: Path
    source: str  # how it was found: "--llama-bin", "LLAMA_CPP_BIN", "cache"
    info: dict = field(default_factory=dict)  # runtime.json, when the build has one
    version: str | None = None  # "version: N (build B, commit C)" line of llama-server --version
    commit: str | None = None

    @property
    def tools(self) -> dict[str, Path]:
        return {t: self.bin_dir / t for t in TOOLS if _is_executable(self.bin_dir / t)}

    @property
    def backends(self) -> tuple[str, ...]:
        found = tuple(b for b, stem in BACKEND_LIBS.items() if _find_lib(self.bin_dir, stem))
        if found:
            return found
        return tuple(self.info.get("backends", ()))  # a static build: trust runtime.json if any

    def tool(self, name: str) -> Path:
        path = self.bin_dir / name
        if not _is_executable(path):
            raise RuntimeNotFound(f"{name} not found or not executable in {self.bin_dir}: {BUILD_HINT}")
        return path

    def lib(self, stem: str) -> Path | None:
        return _find_lib(self.bin_dir, stem)

    @property
    def patches(self) -> list[str]:
        """The ggufbridge patches this build carries (runtime.json; none recorded for other builds)."""
        p = self.info.get("patches")
        return [str(x) for x in p] if isinstance(p, list) else []

    @property
    def canvas_mrope(self) -> bool:
        """Whether libmtmd knows MiniCPM-V 4.7's canvas M-RoPE (the ggufbridge patch), read from the library."""
        return self.has_string(patches.CANVAS_KEY)

    @property
    def exact_multislot_drafting(self) -> bool:
        """Whether libllama carries the recurrent-rollback fix, so that drafting on several slots keeps each
        stream's output (the ggufbridge patch), read from the library."""
        return self.has_string(patches.ROLLBACK_KEY, "libllama")

    def has_string(self, text: str, lib: str = "libmtmd") -> bool:
        """Whether the runtime's `lib` (a static build: llama-server) holds `text` as a C string: how a projector
        name or a metadata key the runtime reads is recognised without running it."""
        target = self.lib(lib) or (self.bin_dir / "llama-server" if _is_executable(self.bin_dir / "llama-server")
                                   else None)
        return target is not None and has_c_string(target, text)

    @property
    def has_page(self) -> bool:
        """Whether llama-server serves its chat page at / (the page embedded at build time), read from the binary."""
        server = self.lib(SERVER_LIB) or self.bin_dir / "llama-server"
        return server.is_file() and has_c_string(server, PAGE_MARKER)

    @property
    def knows_minicpmv4_7(self) -> bool:
        """Whether libmtmd loads upstream's `minicpmv4_7` projector type (its name is a C string there)."""
        return self.has_string(names.PROJECTOR_MINICPMV4_7)

    def env(self) -> dict[str, str]:
        """Environment for launching a tool: shared libs next to the tools come first on the loader path."""
        env = dict(os.environ)
        dirs = [str(d) for d in _lib_dirs(self.bin_dir)] + [env.get("LD_LIBRARY_PATH", "")]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in dirs if p)
        return env


def locate(llama_bin: str | os.PathLike | None = None) -> Runtime:
    """The runtime to use, by the documented order. Raises RuntimeNotFound naming what was tried."""
    if llama_bin:
        return _from_dir(Path(llama_bin), "--llama-bin")
    env_bin = os.environ.get("LLAMA_CPP_BIN")
    if env_bin:
        return _from_dir(Path(env_bin), "LLAMA_CPP_BIN")
    tried, found = [], []
    for variant, want in cached_keys():
        # the build of this package's patch series (build_runtime.sh keys the folder by its hash)
        prefix = cache_dir() / f"llama.cpp-{RUNTIME_VERSION}-{variant}-p{want}"
        info_path = prefix / "runtime.json"
        tried.append(str(info_path))
        if info_path.is_file():
            info = _read_info(info_path)
            bin_dir = Path(info.get("bin") or prefix / "build" / "bin")
            found.append(Runtime(bin_dir=bin_dir, source=f"cache ({variant})", info=info))
    if found:
        bound = bindings_bin_dir()
        return next((r for r in found if bound is not None and _same_dir(r.bin_dir, bound)), found[0])
    raise RuntimeNotFound(f"no llama.cpp runtime: no --llama-bin, no LLAMA_CPP_BIN, no cached build "
                          f"({', '.join(tried)}); {BUILD_HINT}")


def bindings_bin_dir() -> Path | None:
    """The folder the llama_cpp bindings of this interpreter load libllama from (build_runtime.sh links each
    library of a build into llama_cpp/lib), found without importing them; None when they are not bound that way."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    lib = Path(spec.origin).parent / "lib" / "libllama.so"
    return Path(os.path.realpath(lib)).parent if lib.is_symlink() else None


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def cached_keys() -> list[tuple[str, str]]:
    """(variant, series hash) of the cached builds `locate` looks for, in order: per variant (CUDA first) its
    default parts, then the other choice (a CPU build with --perf, a CUDA one with --no-perf)."""
    keys = []
    for variant in VARIANTS:
        default = patches.perf_default(variant)
        for perf in (default, not default):
            keys.append((variant, patches.series_hash(patches.build_series(variant, perf))))
    return keys


def _from_dir(path: Path, source: str) -> Runtime:
    if not path.is_dir():
        raise RuntimeNotFound(f"{source} {path} is not a directory (expected llama.cpp's build/bin)")
    # a ggufbridge-built runtime keeps runtime.json two levels above bin/
    info_path = path.resolve().parent.parent / "runtime.json"
    info = _read_info(info_path) if info_path.is_file() else {}
    return Runtime(bin_dir=path.resolve(), source=source, info=info)


def _read_info(path: Path) -> dict:
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RuntimeNotFound(f"{path} is unreadable ({e}); delete it and {BUILD_HINT}") from None
    if not isinstance(info, dict):
        raise RuntimeNotFound(f"{path}: expected a JSON object, found {type(info).__name__}; {BUILD_HINT}")
    return info


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _lib_dirs(bin_dir: Path) -> list[Path]:
    """A build tree keeps the shared libraries next to the tools; an installed prefix keeps them in ../lib."""
    return [d for d in (bin_dir, bin_dir.parent / "lib", bin_dir.parent / "lib64") if d.is_dir()]


def _find_lib(bin_dir: Path, stem: str) -> Path | None:
    for d in _lib_dirs(bin_dir):
        for suffix in (".so", ".dylib", ".dll"):
            p = d / (stem + suffix)
            if p.is_file():
                return p
    return None


# ------------------------------------------------------------------------------------------------ checks


@dataclass
class CheckResult:
    name: str
    ok: bool
    detail: str
    fix: str = ""


_VERSION_RE = re.compile(r"version:\s*(\S+)\s*\(build\s*(\d+),\s*commit\s*([0-9a-fA-F]+|unknown)\)")


def check(rt: Runtime, timeout: float = 60.0) -> list[CheckResult]:
    """Validate a runtime: tools, `llama-server --version`, capabilities. Fills rt.version / rt.commit."""
    results = []
    for tool in TOOLS:
        path = rt.bin_dir / tool
        ok = _is_executable(path)
        results.append(CheckResult(f"tool {tool}", ok, str(path) if ok else f"missing: {path}",
                                   "" if ok else f"{tool} was not built: {BUILD_HINT}"))

    server_help = ""
    if _is_executable(rt.bin_dir / "llama-server"):
        ok, out = _run([rt.bin_dir / "llama-server", "--version"], rt, timeout)
        m = _VERSION_RE.search(out)
        if ok and m:
            rt.version, rt.commit = m.group(1), m.group(3)
            pinned = PINNED_COMMIT.startswith(rt.commit)
            results.append(CheckResult("llama-server --version", True,
                                       f"build {m.group(2)}, commit {rt.commit}"
                                       + ("" if pinned else f" (ggufbridge pins {PINNED_COMMIT[:9]})")))
        else:
            results.append(CheckResult("llama-server --version", False, _tail(out) or "no output",
                                       "llama-server does not start (missing shared libraries?): " + BUILD_HINT))
        ok, server_help = _run([rt.bin_dir / "llama-server", "--help"], rt, timeout)
        if not ok:
            server_help = ""

    for cap in CAPABILITIES:
        results.append(_check_capability(rt, cap, server_help))
    return results


def _check_capability(rt: Runtime, cap: Capability, server_help: str) -> CheckResult:
    if cap.kind == "help":
        if not server_help:
            return CheckResult(cap.name, False, f"{cap.where} --help did not run", cap.fix)
        ok = re.search(rf"(?<![\w-]){re.escape(cap.needle)}(?![\w-])", server_help) is not None
        return CheckResult(cap.name, ok, f"{'listed' if ok else 'not listed'} in {cap.where} --help", cap.fix)
    lib = rt.lib(cap.where)
    # a static build links everything into the tools; search the server binary then
    target = lib or (rt.bin_dir / "llama-server" if _is_executable(rt.bin_dir / "llama-server") else None)
    if target is None:
        return CheckResult(cap.name, False, f"no {cap.where} library in {rt.bin_dir}", cap.fix)
    ok = has_c_string(target, cap.needle)
    return CheckResult(cap.name, ok, f"{'found' if ok else 'not found'} in {target.name}", cap.fix)


def has_c_string(path: Path, text: str) -> bool:
    """Whether `text` occurs as a whole NUL-terminated C string in the binary at `path`."""
    needle = b"\0" + text.encode() + b"\0"
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return False
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(needle) >= 0


def _run(argv, rt: Runtime, timeout: float) -> tuple[bool, str]:
    try:
        p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, errors="replace", timeout=timeout,
                           env=rt.env(), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    return p.returncode == 0, (p.stdout or "") + (p.stderr or "")


def _tail(text: str, n: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-n:])


# ------------------------------------------------------------------------------------------------ bindings

_BINDINGS_PROBE = r"""
import json, sys
out = {}
try:
    import llama_cpp
    out["version"] = getattr(llama_cpp, "__version__", "?")
    try:
        import llama_cpp.mtmd_cpp  # noqa: F401  (loads libmtmd)
    except Exception as e:
        out["mtmd_error"] = str(e)
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1] if line.split() else ""
            if p.endswith(".so") or ".so." in p or p.endswith(".dylib"):
                name = p.rsplit("/", 1)[-1]
                if name.startswith(("libllama", "libggml", "libmtmd")):
                    libs.add(p)
    out["libs"] = sorted(libs)
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


@dataclass
class BindingsReport:
    python: str
    version: str | None
    libs: list[str]
    error: str | None

    def outside(self, rt: Runtime) -> list[str]:
        """Loaded libraries that are not the runtime's own files."""
        own = {d.resolve() for d in _lib_dirs(rt.bin_dir)}
        return [p for p in self.libs if Path(p).resolve().parent not in own]


def probe_bindings(python: str | None = None, timeout: float = 60.0) -> BindingsReport:
    """Import llama_cpp in a separate interpreter and list the llama/ggml/mtmd libraries it mapped."""
    python = python or sys.executable
    try:
        p = subprocess.run([python, "-c", _BINDINGS_PROBE], capture_output=True, text=True, errors="replace",
                           timeout=timeout, stdin=subprocess.DEVNULL)
        data = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {"error": _tail(p.stderr)}
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        data = {"error": str(e)}
    return BindingsReport(python=python, version=data.get("version"), libs=data.get("libs", []),
                          error=data.get("error"))
