#!/usr/bin/env bash
# Device job `benchmarks/device.sh pytest [PYTEST ARGS]`: the `gpu` tests on the runtime device.sh built. The
# EXL3 tests need the exllamav3 wheels (device.sh pack --exl3); the extension an earlier exl3 run brought back
# ($DEVICE_DIR/exl3/ext/exllamav3_ext.so.gz) spares its ~5 min build.
set -uo pipefail
. "$(dirname "$0")/common.sh"
use_carried_exllamav3_ext "$DEVICE_DIR/exl3/ext/exllamav3_ext.so.gz"
python3 -m pytest -p no:cacheprovider -v -m gpu "${@:-tests}" 2>&1 | tee "$OUT/pytest.log"
