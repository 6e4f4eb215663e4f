#!/usr/bin/env bash
# Device command (issue 28): many clients at once on one H200, at the real 35B-A3B shapes.
# NOT RUN YET: written without device time; the first run will show what needs fixing.
# Carry .dev/gpu (llama-src.tgz, tok) and .dev/gpu4/whl, as recipes_h200.sh. Steps, in order (each skips what is
# already there, so a warm machine resumes):
#   build    the patched runtime, CUDA sm_90 (scripts/build_runtime.sh), plus llama-batched-bench from the same tree;
#            the hq3m file set (make_fullsize_gguf.py, random weights, its DSpark draft) on a tmpfs
#   bench    `ggufbridge bench --concurrency 1,2,4,8` on the hq3m file: one llama-server with -np 8 (the planner's
#            slots: a unified pool, each slot capped at its context), q8_0 KV as the issue's before-table, 1k-token
#            prompts, 128 generated tokens per stream, target-only and drafted; $OUT/concurrency/*
#   profile  one decode step at 1 and 8 sequences: timed (llama-batched-bench, -npl 1,2,4,8) and kernel by kernel
#            (ncu, benchmarks/gpu/decode_profile.py); $OUT/decode-profile-h200.json
#   benchmarks/gpu/concurrency_h200.sh build bench profile
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1 JOBS=${JOBS:-16}
C=${GGUFBRIDGE_CACHE:-$HOME/.cache/ggufbridge}; O=${OUT:-/tmp/out}; mkdir -p $O
S=/root/shm; L=/root/logs; mkdir -p $S $L
mountpoint -q $S || mount -t tmpfs -o size=60G tmpfs $S || echo "no tmpfs at $S"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev/gpu4/whl/*.whl \
  >/dev/null 2>&1 || true
export PYTHONPATH=/tmp/site:$PWD
R=/root/recipes; mkdir -p $R
# the issue's before-table: the h200 recipe with a q8_0 KV cache
printf 'base = "h200"\nname = "h200-q8kv"\n[server]\ncache_type_k = "q8_0"\ncache_type_v = "q8_0"\n' > $R/h200-q8kv.toml
bin_dir() { python3 -c "from ggufbridge.runtime.locate import locate; print(locate().bin_dir)"; }
keep_logs() { tar -czf $O/logs.tgz -C $L . 2>/dev/null; }
t() { echo "== $(date +%T) $*"; }
for step in "$@"; do t "$step"; case $step in
build)
  mkdir -p "$C/src"
  [ -f "$C/src/llama_cpp_python-0.3.36/.extracted" ] || { tar -xzf .dev/gpu/llama-src.tgz -C "$C/src" && touch "$C/src/llama_cpp_python-0.3.36/.extracted"; }
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  T0=$(date +%s)
  ( bash scripts/build_runtime.sh --cuda --cuda-arch 90 > $L/build.log 2>&1 \
      && cmake --build "$(dirname "$(bin_dir)")" -j $JOBS --target llama-batched-bench >> $L/build.log 2>&1
    echo "build rc $? $(( $(date +%s) - T0 )) s" ) &
  [ -f $S/hq3m/manifest.json ] || python3 benchmarks/make_fullsize_gguf.py $S/hq3m --tokenizer .dev/gpu/tok --quant hq3m \
    2>&1 | tail -3 &
  wait; ls -la $S/hq3m; tail -3 $L/build.log ;;
bench)
  timeout 580 python3 -m ggufbridge bench $S/hq3m --recipe $R/h200-q8kv.toml --concurrency 1,2,4,8 --draft \
    --prompt-lengths 1k -n 128 -o $O/concurrency 2>&1 | tail -40 ;;
profile)
  B=$(bin_dir)
  timeout 580 python3 benchmarks/gpu/decode_profile.py "$B" "$(ls $S/hq3m/MiniCPM-V-4_7-*.gguf | head -1)" --npl 1,8 \
    --json $O/decode-profile-h200.json 2>&1 | tail -20 ;;
esac; keep_logs; done
t done
