"""`ggufbridge doctor`: which llama.cpp runtime is in use and whether it can run MiniCPM-V 4.7."""

from __future__ import annotations

import sys

import click

from ggufbridge.cli import _options as opt
from ggufbridge.runtime import locate as loc
from ggufbridge.runtime import patches
from ggufbridge.runtime.artifacts import PROJECTORS
from ggufbridge.ggufio.names import DRAFT_KEYS


@click.command()
@opt.llama_bin()
@click.option("--python", "python", default=None, metavar="PY",
              help="Interpreter whose llama_cpp bindings to inspect (default: this one).")
def command(llama_bin: str | None, python: str | None) -> None:
    """Show the runtime (path, commit, backends), check its capabilities, and say how to fix what is missing.

    Exit code 0 when everything is in place, 2 otherwise (one `problem:` line per missing piece on stderr).
    """
    rt = loc.locate(llama_bin)
    results = loc.check(rt)
    click.echo(f"runtime   {rt.bin_dir}  (found via {rt.source})")
    click.echo(f"version   llama.cpp {rt.version or '?'}, commit {rt.commit or '?'}"
               + (f" (llama-cpp-python {rt.info['version']} tree)" if rt.info.get("version") else ""))
    click.echo(f"backends  {', '.join(rt.backends) or 'none found'}")
    carried = rt.patches
    if carried:
        click.echo(f"patches   ggufbridge series {rt.info.get('patch_hash', '?')}: {', '.join(carried)}")
    if rt.canvas_mrope:
        click.echo("vision    canvas M-RoPE and MiniCPM-V slicing: yes (patched libmtmd); upstream's minicpmv4_7 "
                   "files: " + ("exact, as ours" if rt.knows_minicpmv4_7 else "not loaded (an older series)"))
    else:
        click.echo(f"warning: vision: {patches.STOCK_IMAGE_LOSS}", err=True)
    known = [p for p in PROJECTORS if rt.has_string(p)]
    unknown = [p for p in PROJECTORS if p not in known]
    click.echo(f"mmproj    projectors {', '.join(known) or 'none'}"
               + (f"; not {', '.join(unknown)} (such files will not load here)" if unknown else ""))
    upstream_draft = rt.has_string(DRAFT_KEYS["block_size"][1], "libllama")
    click.echo("draft     DSpark keys dflash.*" + (
        " and dspark.*" if upstream_draft else " (drafts with upstream's dspark.* keys: served from a renamed copy)")
        + ("; several drafting slots exact (rollback patch)" if rt.exact_multislot_drafting else
           "; one drafting slot by default: without the rollback patch several can change a stream's output"))
    if rt.has_page:
        click.echo("page      llama-server's chat page: yes (at the server's address, `ggufbridge serve` prints it)")
    else:
        click.echo(f"warning: page: this llama-server has no chat page (API only); {loc.PAGE_HINT}", err=True)
    want = patches.series_hash()
    if carried and rt.info.get("patch_hash") not in (None, want):
        click.echo(f"warning: this runtime carries patch series {rt.info.get('patch_hash')}, this checkout has "
                   f"{want}: rebuild with scripts/build_runtime.sh", err=True)
    problems = []
    for r in results:
        click.echo(f"  {'ok     ' if r.ok else 'MISSING'}  {r.name:<26} {r.detail}")
        if not r.ok:
            problems.append(f"{r.name}: {r.detail}; {r.fix}")

    b = loc.probe_bindings(python)
    if b.error:
        click.echo(f"bindings  {b.python}: llama_cpp not importable ({b.error})")
        problems.append(f"python bindings: {b.error}; install them with "
                        f"scripts/build_runtime.sh --python {b.python}")
    else:
        click.echo(f"bindings  {b.python}: llama_cpp {b.version} loads")
        for lib in b.libs:
            click.echo(f"            {lib}")
        outside = b.outside(rt)
        if outside:
            problems.append(f"python bindings load {', '.join(outside)}, not the runtime in {rt.bin_dir}; "
                            f"rebind them with scripts/build_runtime.sh --python {b.python}")
    for p in problems:
        click.echo(f"problem: {p}", err=True)
    if problems:
        sys.exit(2)
    click.echo("all checks passed")
