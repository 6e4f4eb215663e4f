# shellcheck shell=bash
# What the device commands in scripts/gpu/ share; sourced by them (`. "$(dirname "$0")/common.sh"`), never run.
# The device is a bare CUDA image: wheels come carried, llama.cpp is built there, extensions are carried back.

# nvcc on PATH, Python output unbuffered (the run's log is read as it comes)
gpu_env() {
  export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
}

# carried wheels (no index: nothing outside the device can be reached) into /tmp/site, first on PYTHONPATH
install_wheels() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$@"
}

# exllamav3 imports a module named exllamav3_ext from sys.path instead of compiling when one is there: one
# brought back by an earlier run (exllamav3_ext.so.gz, stripped) skips the ~5 min build
use_carried_exllamav3_ext() {
  if [ -f "$1" ]; then
    mkdir -p /tmp/extmod && gunzip -c "$1" > /tmp/extmod/exllamav3_ext.so
    export PYTHONPATH=/tmp/extmod${PYTHONPATH:+:$PYTHONPATH}
  fi
}

# the pinned llama.cpp sources (carried as .dev/gpu/llama-src.tgz) unpacked under /root/src; prints the tree
unpack_llama_src() {
  mkdir -p /root/src && tar -xzf .dev/gpu/llama-src.tgz -C /root/src
  echo /root/src/llama_cpp_python-0.3.36/vendor/llama.cpp
}

# build llama-server for sm_90 from tree $1 into $2 (logs in $OUT/configure.log, $OUT/build.log)
build_llama_server() {
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; return 1; }
  cmake --build "$2" -j 16 --target llama-server > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; return 1; }
}
