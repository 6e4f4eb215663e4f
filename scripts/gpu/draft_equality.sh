#!/usr/bin/env bash
# Device command (carry .dev/gpu/llama-src.tgz and .dev/gpu2): build llama-server for sm_90, then compare
# greedy output with and without the DSpark draft on the pairs that draft_equality_prep.py wrote to .dev/gpu2.
set -uo pipefail
. "$(dirname "$0")/common.sh"
gpu_env
L=$(unpack_llama_src)
T0=$(date +%s)
build_llama_server "$L" /root/b || exit 1
echo "build $(( $(date +%s) - T0 )) s"
timeout 120 python3 scripts/gpu/draft_equality.py /root/b/bin 2>&1 | tee "$OUT/check.txt"
