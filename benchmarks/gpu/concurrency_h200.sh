#!/usr/bin/env bash
# Device job `benchmarks/device.sh streams STEP...` (issue 28): many clients at once on one H200, at the real
# 35B-A3B shapes, on the runtime device.sh built (with --target llama-batched-bench).
# NOT RUN YET: written without device time; the first run will show what needs fixing. Steps, in order (each skips
# what is already there, so a warm machine resumes):
#   build    the hq3m file set (make_fullsize_gguf.py, random weights, its DSpark draft) on a RAM-backed tmpfs
#   bench    `ggufbridge bench --concurrency 1,2,4,8` on the hq3m file: one llama-server with -np 8 (the planner's
#            slots: a unified pool, each slot capped at its context), q8_0 KV as the before-table, 1k-token
#            prompts, 128 generated tokens per stream, target-only and drafted; $OUT/concurrency/*
#   profile  one decode step at 1 and 8 sequences: timed (llama-batched-bench, -npl 1,2,4,8) and kernel by kernel
#            (ncu, benchmarks/gpu/decode_profile.py); $OUT/decode-profile-h200.json
#   benchmarks/device.sh streams build bench profile
set -uo pipefail
O=$OUT; S=$WORK/shm; L=$WORK/logs; R=$WORK/recipes; mkdir -p $S $L $R
mountpoint -q $S || mount -t tmpfs -o size=60G tmpfs $S || echo "no tmpfs at $S"
# the before-table: the h200 recipe with a q8_0 KV cache
printf 'base = "h200"\nname = "h200-q8kv"\n[server]\ncache_type_k = "q8_0"\ncache_type_v = "q8_0"\n' > $R/h200-q8kv.toml
keep_logs() { tar -czf $O/logs.tgz -C $L . 2>/dev/null; }
t() { echo "== $(date +%T) $*"; }
for step in "$@"; do t "$step"; case $step in
build)
  [ -f $S/hq3m/manifest.json ] || python3 benchmarks/make_fullsize_gguf.py $S/hq3m --tokenizer "$DEVICE_DIR/tok" \
    --quant hq3m 2>&1 | tail -3
  ls -la $S/hq3m ;;
bench)
  timeout 580 python3 -m ggufbridge bench $S/hq3m --recipe $R/h200-q8kv.toml --concurrency 1,2,4,8 --draft \
    --prompt-lengths 1k -n 128 -o $O/concurrency 2>&1 | tail -40 ;;
profile)
  timeout 580 python3 benchmarks/gpu/decode_profile.py "$RUNTIME_BIN" "$(ls $S/hq3m/MiniCPM-V-4_7-*.gguf | head -1)" \
    --npl 1,8 --json $O/decode-profile-h200.json 2>&1 | tail -20 ;;
*) echo "streams: unknown step $step (build bench profile)" >&2; exit 2 ;;
esac; keep_logs; done
t done
