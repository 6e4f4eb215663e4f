#!/usr/bin/env bash
# Device command (carry .dev/gpu/llama-src.tgz, .dev/gpu/tok and .whl): build llama-server for sm_90 while the
# full-size random target + DSpark draft are generated, then run draft_ties.py on them.
set -uo pipefail
. "$(dirname "$0")/common.sh"
gpu_env
install_wheels .whl/gguf-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
L=$(unpack_llama_src)
T0=$(date +%s)
[ -f .dev/gpu/tok/tokenizer.json ] || gunzip -k .dev/gpu/tok/tokenizer.json.gz
( python3 scripts/make_fullsize_gguf.py /root/fs --tokenizer .dev/gpu/tok > "$OUT/gen.log" 2>&1; echo "gen rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/gen.log" ) &
GEN=$!
build_llama_server "$L" /root/b || exit 1
echo "build $(( $(date +%s) - T0 )) s"
wait $GEN; tail -3 "$OUT/gen.log"
cd scripts/gpu && timeout 240 python3 draft_ties.py /root/b/bin /root/fs
