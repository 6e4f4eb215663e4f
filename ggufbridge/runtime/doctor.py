"""What `ggufbridge doctor` reports: the llama.cpp runtime in use, what it can run, and how to fix what is missing.
The command prints the report; the checks themselves are `locate.check` and `locate.probe_bindings`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ggufbridge.errors import RuntimeNotFound
from ggufbridge.ggufio.names import DRAFT_KEYS
from ggufbridge.runtime import locate as loc
from ggufbridge.runtime import patches
from ggufbridge.runtime.artifacts import PROJECTORS
from ggufbridge.runtime.machine import read_machine


@dataclass
class Report:
    lines: list[tuple[str, bool]] = field(default_factory=list)  # (text, on stderr), in the order they are shown
    problems: list[str] = field(default_factory=list)  # one per missing piece, with its fix: doctor exits 2

    def out(self, text: str) -> None:
        self.lines.append((text, False))

    def warn(self, text: str) -> None:
        self.lines.append((f"warning: {text}", True))


def series_line() -> str:
    """This package's patch series: each part's patch count and the hash of each build choice (the cache keys
    `locate` looks for)."""
    core, perf = patches.series(patches.CORE), patches.series(patches.PERF)
    return (f"{patches.PARTS[0]} {len(core)} patches (hash {patches.series_hash(core)}, CPU builds), "
            f"+ {patches.PARTS[1]} {len(perf)} (hash {patches.series_hash(core + perf)}, CUDA builds)")


def diagnose(llama_bin: str | None = None, python: str | None = None) -> Report:
    """The runtime (`locate(llama_bin)`: path, commit, backends, patches, vision, drafts, chat page), its capability
    checks, and the Python bindings of `python` (default: this interpreter)."""
    r = Report()
    r.out(f"series    {series_line()}")
    try:
        rt = loc.locate(llama_bin)
    except RuntimeNotFound as e:
        # no build yet (a fresh install): say so and the one command that builds it, and stop there
        r.out(f"runtime   none: {e}")
        r.problems.append("runtime: no llama.cpp build of this package's patch series; build it with "
                          "`ggufbridge build-runtime` (add --cuda for a GPU build: the CUDA toolkit must be "
                          "installed), then run `ggufbridge doctor` again")
        return r
    results = loc.check(rt)
    r.out(f"runtime   {rt.bin_dir}  (found via {rt.source})")
    r.out(f"version   llama.cpp {rt.version or '?'}, commit {rt.commit or '?'}"
          + (f" (llama-cpp-python {rt.info['version']} tree)" if rt.info.get("version") else ""))
    r.out(f"backends  {', '.join(rt.backends) or 'none found'}")
    m = read_machine(runtime=rt)
    for line in m.lines():
        r.out(f"machine   {line.removeprefix('machine: ')}")
    cuda = [d for d in m.devices if d.name.startswith("CUDA")]
    if "cuda" in rt.backends:
        r.out(f"cuda      CUDA backend built in; {len(cuda)} CUDA device(s) seen")
    else:
        r.out("cuda      not in this runtime (a CPU build; scripts/setup.sh --cuda builds a CUDA one)")
    carried = rt.patches
    if carried:
        r.out(f"patches   ggufbridge series {rt.info.get('patch_hash', '?')}: {len(carried)} patches")
        r.lines += [(f"            {p}", False) for p in carried]
    if rt.canvas_mrope:
        r.out("vision    canvas M-RoPE and MiniCPM-V slicing: yes (patched libmtmd); upstream's minicpmv4_7 files: "
              + ("exact, as ours" if rt.knows_minicpmv4_7 else "not loaded (an older series)"))
    else:
        r.warn(f"vision: {patches.STOCK_IMAGE_LOSS}")
    known = [p for p in PROJECTORS if rt.has_string(p)]
    unknown = [p for p in PROJECTORS if p not in known]
    r.out(f"mmproj    projectors {', '.join(known) or 'none'}"
          + (f"; not {', '.join(unknown)} (such files will not load here)" if unknown else ""))
    upstream_draft = rt.has_string(DRAFT_KEYS["block_size"][1], "libllama")
    r.out("draft     DSpark keys dflash.*" + (
        " and dspark.*" if upstream_draft else " (drafts with upstream's dspark.* keys: served from a renamed copy)")
        + ("; several drafting slots exact (rollback patch)" if rt.exact_multislot_drafting else
           "; one drafting slot by default: without the rollback patch several can change a stream's output"))
    if rt.has_page:
        r.out("page      llama-server's chat page: yes (at the server's address, `ggufbridge serve` prints it)")
    else:
        r.warn(f"page: this llama-server has no chat page (API only); {loc.PAGE_HINT}")
    wanted = {h for _, h in loc.cached_keys()}
    if carried and rt.info.get("patch_hash") not in wanted | {None}:
        r.warn(f"this runtime carries patch series {rt.info.get('patch_hash')}, this package has "
               f"{' or '.join(sorted(wanted))}: rebuild with `ggufbridge build-runtime`")
    for c in results:
        r.out(f"  {'ok     ' if c.ok else 'MISSING'}  {c.name:<26} {c.detail}")
        if not c.ok:
            r.problems.append(f"{c.name}: {c.detail}; {c.fix}")
    b = loc.probe_bindings(python)
    if b.error:
        r.out(f"bindings  {b.python}: llama_cpp not importable ({b.error})")
        r.problems.append(f"python bindings: {b.error}; install them with "
                          f"`ggufbridge build-runtime --python {b.python}`")
    else:
        r.out(f"bindings  {b.python}: llama_cpp {b.version} loads")
        r.lines += [(f"            {lib}", False) for lib in b.libs]
        outside = b.outside(rt)
        if outside:
            r.problems.append(f"python bindings load {', '.join(outside)}, not the runtime in {rt.bin_dir}; "
                              f"rebind them with `ggufbridge build-runtime --python {b.python}`")
    return r
