#!/usr/bin/env bash
# Device job `benchmarks/device.sh recipes STEP...` (issue 16): hardware recipes measured at the real 35B-A3B shapes
# on one H200, as their users run them (recipe_bench.py starts llama-server with `ggufbridge serve --recipe R`'s
# argv), on the patched runtime device.sh built. Steps, in order (each skips what is already there, so a warm
# machine resumes; the disk is 64 GB, so the big files go to a RAM-backed tmpfs and are deleted when done):
#   build   the first random-weight files (the runtime itself is built by device.sh)
#   compute start-up compute buffers per -ub / -c / KV type (4-layer full-width proxy; buffers do not depend on depth)
#   r4090a/b rtx4090 recipe: the hq3m file (<= 18.0 GB) at 262,144 tokens, and Q4_K_M (+ --n-cpu-moe from the plan)
#   draft   drafting economics on the full-shape oracle pair (acceptance as a knob), n_max 2..15
#   verify  the current planner's own choices for rtx4090, measured: Q4_K_M (--n-cpu-moe as planned) and hq4 whole
#   spark   decode speed of the Spark candidates (spark recipe): hq4, Q6_K, Q8_0, BF16
#   rpc     llama.cpp RPC at full shape (Q8_0), as `serve --rpc local` runs it, against the same file on one GPU:
#           the server's GPU + one loopback worker on the next GPU (spark-x2's topology), and every layer on two
#           workers, one per GPU. On nvidia-h200-x2 each side has its own GPU; on one GPU both share it (the
#           RPC traffic and the layer split are real, the second GPU is not): the tag says how many there were.
#   benchmarks/device.sh recipes STEP...
set -uo pipefail
O=$OUT
M=$WORK/m; S=$WORK/shm; L=$WORK/logs; mkdir -p $M $S $L
mountpoint -q $S || mount -t tmpfs -o size=118G tmpfs $S || echo "no tmpfs at $S"
J=$O/recipes-h200.json
RB="python3 -m benchmarks.gpu.recipe_bench"
gen() {  # gen DIR ARGS...: one random-weight file set, unless already there
  local d=$1; shift
  [ -f $d/manifest.json ] || { python3 -m benchmarks.make_fullsize_gguf $d --tokenizer "$DEVICE_DIR/tok" "$@" 2>&1 | tail -3; }
}
keep_logs() { tar -czf $O/logs.tgz -C $L . 2>/dev/null; }
t() { echo "== $(date +%T) $*"; df -h / $S | tail -2 | awk '{print "   " $6, $3 "/" $2}'; }
for step in "$@"; do t "$step"; case $step in
build)
  gen $M/hq3m --quant hq3m --no-draft &
  gen $M/q4km --no-draft &
  gen $M/proxy4 --layers 4 --no-draft &
  gen $S/oracle --oracle &
  wait; ls -la $M/* $S/* | grep gguf ;;
compute)
  $RB compute $M/proxy4 --recipe h200 --ub 512,2048 --ctx 8192,65536,262144 --kv f16,q8_0 \
    --json $O/compute-h200.json --logdir $L --timeout 120 ;;
r4090a)
  $RB measure $M/hq3m --recipe rtx4090 --tag rtx4090-hq3m --ctx 262144 --lengths 1k,32k,128k,256k --json $J --logdir $L ;;
r4090b)
  $RB measure $M/q4km --recipe rtx4090 --tag rtx4090-q4km --ctx 262144 --lengths 1k,32k --json $J --logdir $L ;;
draft)
  $RB draft $S/oracle --recipe h200 --n-max 2,3,4,6,8,11,15 --json $O/draft-h200.json --logdir $L -n 160 ;;
verify)
  gen $M/q4km --no-draft & gen $M/hq4 --quant hq4 --no-draft & wait
  $RB measure $M/q4km --recipe rtx4090 --tag rtx4090-q4km-replan --ctx 262144 --lengths 1k,32k --json $J --logdir $L
  $RB measure $M/hq4 --recipe rtx4090 --tag rtx4090-hq4 --ctx 262144 --lengths 1k,32k --json $J --logdir $L ;;
spark)
  rm -rf $M/hq3m $M/q4km $M/proxy4 $M/hq4 $M/q6k $M/q8 $M/bf16 $S/oracle
  gen $M/q8 --quant q8_0 --no-draft & gen $S/bf16 --quant bf16 --no-draft & gen $S/hq4 --quant hq4 --no-draft & wait
  $RB measure $S/hq4 --recipe spark --tag spark-hq4 --lengths 1k,32k --json $J --logdir $L; rm -rf $S/hq4
  $RB measure $M/q8 --recipe spark --tag spark-q8_0 --lengths 1k,32k --json $J --logdir $L
  $RB measure $S/bf16 --recipe spark --tag spark-bf16 --lengths 1k,32k --json $J --logdir $L
  rm -rf $M/q8; gen $M/q6k --quant q6_k --no-draft; $RB measure $M/q6k --recipe spark --tag spark-q6k --lengths 1k,32k --json $J --logdir $L ;;
rpc)
  gen $M/q8 --quant q8_0 --no-draft
  ls $M/q8/mmproj-* >/dev/null 2>&1 || python3 -m benchmarks.make_fullsize_mmproj $M/q8 2>&1 | tail -1  # its device
  G=$(nvidia-smi -L | wc -l); R=$WORK/rpc-recipes; mkdir -p $R
  printf 'base = "h200"\nname = "h200-host+1"\n[rpc]\nworkers = 1\nworker_gib = 139\nworker_headroom_gib = 4\n' > $R/host1.toml
  printf 'base = "h200"\nname = "h200-2workers"\n[memory]\ngpu_gib = []\n[rpc]\nworkers = 2\nworker_gib = 139\nworker_headroom_gib = 4\n' > $R/w2.toml
  for cfg in h200:one-gpu $R/host1.toml:host+1worker $R/w2.toml:2workers; do
    $RB measure $M/q8 --recipe ${cfg%%:*} --tag rpc-q8_0-${G}gpu-${cfg##*:} --ctx 65536 --lengths 1k,32k \
      --json $O/rpc-h200.json --logdir $L
  done ;;
esac; keep_logs; done
t done
