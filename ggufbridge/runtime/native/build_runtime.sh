#!/usr/bin/env bash
# Builds the pinned llama.cpp runtime (the tree vendored in llama-cpp-python, ggufbridge/runtime/llama_cpp.pin) once per machine:
# shared libraries for the Python bindings plus the tools ggufbridge launches, and llama-server's chat page
# (build_ui.sh beside this script: the tree's tools/ui with npm; without npm the server is built without it). Cached
# outside the repo. Shipped in the package with the patch series (ggufbridge/runtime/native/); run it as
# `ggufbridge build-runtime`, scripts/build_runtime.sh or this file.
#
#   build_runtime.sh [--cuda] [--cuda-arch 90] [--perf|--no-perf] [--python PY] [--tests] [--target T]...
#                    [--without-patch NAME]... [--with-patch FILE]...
#   build_runtime.sh --source-only     (fetch the pristine pinned tree only; print its path)
#
# The series has two parts (docs/patches.md): llama.cpp/ (what the model needs to be served correctly), always
# applied, then llama.cpp-perf/ (performance), applied by default to CUDA builds only; --perf / --no-perf choose.
# Which patches a build applies, and their hash (the build folder's key), come from patches.py, their one home.
# --python PY: also install llama-cpp-python's Python package (no second compile) into PY's environment
#              and point it at the libraries built here.
# --tests / --target T: also configure the tree's own tests and build test-backend-ops / also build the tree's
#              target T (e.g. llama-batched-bench): what the GPU benchmarks run beside the runtime.
# --without-patch NAME: the series without the one patch whose file name contains NAME (repeatable: without each),
#              built into its own cache folder (the series hash keys it), so that a build with and one without a
#              patch can be compared side by side (benchmarks/device.sh fattn). ggufbridge itself only ever finds the
#              full series.
# --with-patch FILE: the series and then FILE (repeatable, in order), also in its own cache folder: a candidate patch
#              measured against the series before it joins it (patches/not-applied/).
#              Found through LLAMA_CPP_BIN, never by ggufbridge's own lookup.
# Once built it prints "build_runtime: runtime ready in BIN_DIR" (benchmarks/device.sh reads BIN_DIR from it).
set -euo pipefail

# the pin (llama-cpp-python release and the llama.cpp commit it vendors) has one home, read by Python too
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/../llama_cpp.pin"
VERSION=$LLAMA_CPP_PYTHON_VERSION
COMMIT=$LLAMA_CPP_COMMIT
CUDA=0
CUDA_ARCH=""
PERF=""
PY=""
SOURCE_ONLY=0
TESTS=0
EXTRA_TARGETS=()
WITHOUT=()
WITH=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) CUDA=1 ;;
    --cuda-arch) CUDA_ARCH="${2:?--cuda-arch needs an architecture, e.g. 89}"; shift ;;
    --perf) PERF=--perf ;;
    --no-perf) PERF=--no-perf ;;
    --python) PY="$2"; shift ;;
    --source-only) SOURCE_ONLY=1 ;;
    --tests) TESTS=1; EXTRA_TARGETS+=(test-backend-ops) ;;
    --target) EXTRA_TARGETS+=("${2:?--target needs a target name}"); shift ;;
    --without-patch) WITHOUT+=("${2:?--without-patch needs a patch name}"); shift ;;
    --with-patch) WITH+=("${2:?--with-patch needs a patch file}"); shift ;;
    -h|--help) sed -n 2,27p "$0"; exit 0 ;;
    *) echo "build_runtime: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done

CACHE="${GGUFBRIDGE_CACHE:-$HOME/.cache/ggufbridge}"
VARIANT=cpu
[ "$CUDA" = 1 ] && VARIANT=cuda
# the patches this build applies, in order, and their hash (the cache key: a changed, added or removed patch gives a
# new build folder), from the series' one home (patches.py; it refuses a --without-patch that names not exactly one)
sel_args=(select --variant "$VARIANT" $PERF)
for name in "${WITHOUT[@]}"; do sel_args+=(--without "$name"); done
for f in "${WITH[@]}"; do sel_args+=(--with "$f"); done
sel=$("${GGUFBRIDGE_PYTHON:-python3}" "$HERE/../patches.py" "${sel_args[@]}") || exit 2
PHASH=$(head -1 <<<"$sel")
PATCHES=()
while IFS= read -r f; do [ -n "$f" ] && PATCHES+=("$f"); done < <(tail -n +2 <<<"$sel")
if [ ${#WITHOUT[@]} -gt 0 ]; then
  kept=" $(for f in "${PATCHES[@]}"; do basename "$f"; done | tr '\n' ' ')"
  dropped_all=()
  while IFS= read -r f; do case "$kept" in *" $(basename "$f") "*) ;; *) dropped_all+=("$(basename "$f")") ;; esac
  done < <("${GGUFBRIDGE_PYTHON:-python3}" "$HERE/../patches.py" select --variant "$VARIANT" $PERF | tail -n +2)
  echo "build_runtime: the series without ${dropped_all[*]} (hash $PHASH)" >&2
fi
perf_note="the core part"
case "${PATCHES[*]}" in *"/llama.cpp-perf/"*) perf_note="the core and the performance part" ;; esac
echo "build_runtime: $VARIANT build, ${#PATCHES[@]} patches (hash $PHASH): $perf_note" >&2
[ ${#WITH[@]} -gt 0 ] && echo "build_runtime: the series and then $(for f in "${WITH[@]}"; do basename "$f"; done | tr '\n' ' ')(hash $PHASH)" >&2
PREFIX="$CACHE/llama.cpp-$VERSION-$VARIANT-p$PHASH"
SRC="$CACHE/src/llama_cpp_python-$VERSION"         # pristine sdist (also the bindings' Python sources)
TREE="$CACHE/src/llama.cpp-$VERSION-p$PHASH"         # the vendored llama.cpp with the patches applied
JOBS="${JOBS:-$(nproc)}"
TOOLS=(llama-server llama-cli llama-mtmd-cli llama-quantize llama-imatrix llama-perplexity ggml-rpc-server)

mkdir -p "$CACHE/src"
if [ ! -f "$SRC/.extracted" ]; then
  sdist="$CACHE/src/llama_cpp_python-$VERSION.tar.gz"
  if [ ! -f "$sdist" ]; then
    echo "build_runtime: downloading llama-cpp-python $VERSION sdist" >&2
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$tmp"
    mv "$tmp"/llama_cpp_python-$VERSION.tar.gz "$sdist"
    rm -rf "$tmp"
  fi
  rm -rf "$SRC"
  tar -xzf "$sdist" -C "$CACHE/src"
  touch "$SRC/.extracted"
fi
if [ "$SOURCE_ONLY" = 1 ]; then
  echo "$SRC/vendor/llama.cpp"   # scripts/patches.sh starts its git copy of the series from here
  exit 0
fi

if [ ! -f "$TREE/.patched" ]; then
  rm -rf "$TREE" "$TREE.tmp"
  cp -r "$SRC/vendor/llama.cpp" "$TREE.tmp"
  for f in "${PATCHES[@]}"; do
    echo "build_runtime: applying $(basename "$f")"
    patch -p1 --forward --batch --quiet -d "$TREE.tmp" <"$f" >"$TREE.patch.log" 2>&1 \
      || { cat "$TREE.patch.log" >&2; echo "build_runtime: $(basename "$f") does not apply to the pinned tree" >&2; exit 1; }
  done
  touch "$TREE.tmp/.patched"
  mv "$TREE.tmp" "$TREE"
fi

# the tree's .git file points at the sdist's submodule repository by a relative path: point it there absolutely so
# that the build records the pinned commit (llama-server --version) from the patched copy too
# (rewritten only when it differs: CMake re-runs its configure step when the file changes)
gitdir="gitdir: $SRC/.git/modules/vendor/llama.cpp"
if [ -d "$SRC/.git/modules/vendor/llama.cpp" ] && [ "$(cat "$TREE/.git" 2>/dev/null)" != "$gitdir" ]; then
  echo "$gitdir" >"$TREE/.git"
fi

args=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
      -DGGML_RPC=ON -DLLAMA_BUILD_MTMD=ON)
[ "$TESTS" = 1 ] && args=("${args[@]/-DLLAMA_BUILD_TESTS=OFF/-DLLAMA_BUILD_TESTS=ON}")
if [ "$CUDA" = 1 ]; then
  args+=(-DGGML_CUDA=ON)
  [ -n "$CUDA_ARCH" ] && args+=("-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH")
fi
# The CPU code is built for this machine (GGML_NATIVE), except AMX: virtual machines may advertise AMX and still
# trap its tile instructions (SIGILL in ggml's AMX Q8_0/Q4 kernels, seen on this project's CI machines). Where
# /proc/cpuinfo lists amx_tile, the native feature set is spelled out without it.
if [ "$(uname -m)" = x86_64 ] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  args+=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  for pair in sse4_2:SSE42 avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
              avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    case "$flags" in *" ${pair%%:*} "*) args+=("-DGGML_${pair##*:}=ON") ;; *) args+=("-DGGML_${pair##*:}=OFF") ;; esac
  done
fi
# a build made with other settings (e.g. before the line above) is rebuilt in place, incrementally
BUILD_KEY=$(printf '%s\n' "${args[@]}" | sha256sum | cut -c1-12)
grep -q "\"build_key\": \"$BUILD_KEY\"" "$PREFIX/runtime.json" 2>/dev/null || rm -f "$PREFIX/runtime.json"

# The chat page, built apart from llama.cpp (its own cache, keyed by the UI sources) and handed to the tree's CMake
# as tools/ui/dist, which the tree's scripts/ui-assets.cmake embeds into llama-server as it does release assets
# (its first choice; -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF keep npm and the download out of CMake).
# Embedded rather than served from a folder with --path: the server lets a browser fetch the embedded assets
# without the API key, but would ask it for every file of a --path folder, so the page could not load under
# --api-key. A new page rebuilds only the generated ui.cpp and relinks llama-server; the build key is unchanged.
PAGE=$(bash "$HERE/build_ui.sh" "$TREE/tools/ui" "$CACHE/ui") \
  || { echo "build_runtime: the chat page could not be built: llama-server is built without it" >&2; PAGE=""; }
UI_KEY=none
if [ -n "$PAGE" ]; then
  UI_KEY=${PAGE##*/page-}
  if [ "$(cat "$TREE/.ggufbridge-page" 2>/dev/null)" != "$UI_KEY" ] || [ ! -f "$TREE/tools/ui/dist/index.html" ]; then
    rm -rf "$TREE/tools/ui/dist"
    cp -r "$PAGE" "$TREE/tools/ui/dist.tmp"
    mv "$TREE/tools/ui/dist.tmp" "$TREE/tools/ui/dist"
    echo "$UI_KEY" >"$TREE/.ggufbridge-page"  # not in dist/ (embedded) nor tools/ui (hashed into the key)
  fi
elif [ -f "$PREFIX/runtime.json" ]; then
  UI_KEY=$(sed -n 's/.*"ui": "\([^"]*\)".*/\1/p' "$PREFIX/runtime.json")  # keep what the runtime has
  UI_KEY=${UI_KEY:-none}
fi

write_info() {
  local backends='["cpu","rpc"]' plist="" f
  [ "$CUDA" = 1 ] && backends='["cpu","rpc","cuda"]'
  for f in "${PATCHES[@]}"; do plist="$plist${plist:+, }\"$(basename "$f" .patch)\""; done
  printf '{"version": "%s", "commit": "%s", "variant": "%s", "backends": %s, "bin": "%s", "patches": [%s], "patch_hash": "%s", "build_key": "%s", "ui": "%s"}\n' \
    "$VERSION" "$COMMIT" "$VARIANT" "$backends" "$PREFIX/build/bin" "$plist" "$PHASH" "$BUILD_KEY" "$UI_KEY" >"$PREFIX/runtime.json.tmp"
  mv "$PREFIX/runtime.json.tmp" "$PREFIX/runtime.json"
}

if [ -f "$PREFIX/runtime.json" ] && ! grep -q "\"ui\": \"$UI_KEY\"" "$PREFIX/runtime.json"; then
  echo "build_runtime: embedding the chat page into llama-server (llama.cpp itself is not rebuilt)"
  cmake --build "$PREFIX/build" -j "$JOBS" --target llama-server >"$PREFIX.ui.log" 2>&1 \
    || { tail -40 "$PREFIX.ui.log" >&2; exit 1; }
  write_info
fi

if [ ! -f "$PREFIX/runtime.json" ]; then
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  echo "build_runtime: configuring ($VARIANT) in $PREFIX/build"
  cmake -S "$TREE" -B "$PREFIX/build" "${gen[@]}" "${args[@]}" >"$PREFIX.configure.log" 2>&1 \
    || { tail -30 "$PREFIX.configure.log" >&2; exit 1; }
  echo "build_runtime: building ${TOOLS[*]} and the shared libraries with $JOBS jobs (a few minutes)"
  # the extra targets in the same build, so that their compile overlaps the libraries' (test-backend-ops: ~1 min)
  cmake --build "$PREFIX/build" -j "$JOBS" --target llama mtmd "${TOOLS[@]}" "${EXTRA_TARGETS[@]}" >"$PREFIX.build.log" 2>&1 \
    || { tail -40 "$PREFIX.build.log" >&2; exit 1; }
  write_info
fi
if [ ${#EXTRA_TARGETS[@]} -gt 0 ]; then  # every time: the build key does not record them (ninja: a no-op when built)
  echo "build_runtime: building ${EXTRA_TARGETS[*]}"
  cmake --build "$PREFIX/build" -j "$JOBS" --target "${EXTRA_TARGETS[@]}" >"$PREFIX.extra.log" 2>&1 \
    || { tail -40 "$PREFIX.extra.log" >&2; exit 1; }
fi
echo "build_runtime: runtime ready in $PREFIX/build/bin"

if [ -n "$PY" ]; then
  # The bindings load libllama/libmtmd/libggml from their own llama_cpp/lib folder; install the
  # Python sources without compiling and link that folder to the libraries built above.
  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$PY" -m pip install -q --no-deps --no-build-isolation "$SRC" 2>/dev/null \
    || CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$PY" -m pip install -q --no-deps "$SRC"
  "$PY" -m pip install -q "typing-extensions>=4.5.0" "diskcache>=5.6.1" "jinja2>=2.11.3" "numpy>=1.20.0"
  pkg=$("$PY" -c 'import importlib.util,os;print(os.path.dirname(importlib.util.find_spec("llama_cpp").origin))')
  mkdir -p "$pkg/lib"
  for so in "$PREFIX/build/bin"/*.so*; do ln -sf "$so" "$pkg/lib/$(basename "$so")"; done
  echo "build_runtime: llama-cpp-python $VERSION bound to $PREFIX/build/bin"
fi
