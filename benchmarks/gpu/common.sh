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
