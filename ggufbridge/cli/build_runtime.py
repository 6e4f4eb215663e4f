"""`ggufbridge build-runtime`: build the patched llama.cpp runtime this package runs (what `doctor` asks for)."""

from __future__ import annotations

import click


@click.command()
@click.option("--cuda", is_flag=True, help="Build the CUDA backend too (needs the CUDA toolkit).")
@click.option("--cuda-arch", metavar="N", default=None,
              help="CUDA architecture(s) to compile for, e.g. 89 (RTX 4090), 90 (H100/H200); "
                   "[default: CMake's choice for this machine].")
@click.option("--perf/--no-perf", default=None,
              help="Apply the performance part of the patch series (docs/patches.md) [default: with --cuda only].")
@click.option("--python", "python", default=None, metavar="PY",
              help="Interpreter whose llama_cpp bindings to bind to the build [default: this one].")
def command(cuda: bool, cuda_arch: str | None, perf: bool | None, python: str | None) -> None:
    """Build llama.cpp with ggufbridge's patch series into ~/.cache/ggufbridge (once per machine and series; a
    second run reuses the build) and bind the llama_cpp bindings to it. The same script as scripts/setup.sh."""
    from ggufbridge.runtime.build import build_runtime

    build_runtime(cuda=cuda, cuda_arch=cuda_arch, perf=perf, python=python)
    click.echo("runtime ready: `ggufbridge doctor` shows it")
