"""Imported by Python at start-up when this folder is on PYTHONPATH (benchmarks/gpu/fit_scaling.sh with LLAMA_FIRST=1):
llama_cpp, and with it libllama and the CUDA backend, loaded before anything else of the process, and the
bindings' models loaded verbose.

Why: on the H200 image (2026-12-05), `ggufbridge quantize --fit-bytes` in a plain CLI process died with SIGSEGV
inside llama_model_load_from_file at its first GPU load, three runs of three, while the same loads passed in
scripts that import llama_cpp first (verbose or not), and the whole fit-scaling run passed with this file. The
import order is the cause: on the unpatched tree numpy first crashed 4 of 4 GPU loads, llama_cpp first loaded 2 of 2
(benchmarks/device.sh import-order; docs/quant.md "Known problem").
This is how the benchmark's figures were taken; the CLI itself now loads the bindings before numpy
(ggufbridge/cli/__init__.py BINDINGS_FIRST), not yet run on the device."""

try:
    import llama_cpp

    _init = llama_cpp.Llama.__init__

    def _verbose_init(self, *a, **k):
        k["verbose"] = True
        return _init(self, *a, **k)

    llama_cpp.Llama.__init__ = _verbose_init
except ImportError:  # not the device's set-up: nothing to do
    pass
