# shellcheck shell=bash
# What the device jobs in benchmarks/gpu/ share beyond benchmarks/device.sh (which sets up the device's Python, the
# patched runtime and $DEVICE_DIR, $WORK, $OUT, $RUNTIME_BIN); sourced by them, never run.

# exllamav3 imports a module named exllamav3_ext from sys.path instead of compiling when one is there: one
# brought back by an earlier run (exllamav3_ext.so.gz, stripped) skips the ~5 min build
use_carried_exllamav3_ext() {
  if [ -f "$1" ]; then
    mkdir -p "$WORK/extmod" && gunzip -c "$1" > "$WORK/extmod/exllamav3_ext.so"
    export PYTHONPATH=$WORK/extmod${PYTHONPATH:+:$PYTHONPATH}
  fi
}

# The compute capability of the first GPU as nvcc's -arch number (90 on an H200), for the kernel harnesses.
gpu_arch() { nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .; }

# The ggml folder a kernel harness compiles against: TREE's own when ggml-cuda/FILE shows it already carries the
# patches, else a copy of TREE's ggml in DIR with PATCH... applied in order (no runtime build).
patched_ggml() {  # DIR TREE FILE PATCH...
  local dir=$1 tree=$2 file=$3 p
  shift 3
  if [ -f "$tree/ggml/src/ggml-cuda/$file" ]; then echo "$tree/ggml"; return 0; fi
  cp -r "$tree/ggml" "$dir/ggml"
  for p in "$@"; do patch -p1 --batch --quiet -d "$dir" < "$p" >&2 || return 1; done
  echo "$dir/ggml"
}
