#!/usr/bin/env bash
# Device job `benchmarks/device.sh fattn STEP...` (issue 24): flash-attention decode at depth with quantized K/V,
# the patch series without (b0) and with (b1) the GQA patch (patches/llama.cpp/*fattn-gqa*), side by side. Both are
# built by scripts/build_runtime.sh: b1 is the runtime device.sh built (with --tests: test-backend-ops), b0 the
# same series --without-patch fattn-gqa, in its own cache folder, built by the first step that needs it.
# $WORK/b0 and $WORK/b1 link to the two bin folders (the results and logs name the builds by them). Steps (each
# skips what a warm machine already has):
#   build    b0 beside the files: the hq3m random-weight target (17.48 GB) and the oracle pair (make_fullsize_gguf.py
#            --oracle), on a RAM-backed tmpfs
#   fatest   upstream test-backend-ops -o FLASH_ATTN_EXT on CUDA0 against the CPU (b1), and kernel times at GQA 8 /
#            head 256 of the old dispatch, the new one, and the GQA variant for batches up to 16 tokens
#            ($OUT/fa-perf.txt)
#   exact-KV greedy 64 tokens at 32k depth, both builds: identical tokens, top-20 KL ($OUT/exact.json)
#   depth-KV target-only decode at 1k/32k/128k/256k (hq3m, the h200 recipe's flags with K/V type KV), both
#            builds (f16: b1 only, f16 K/V never reach the changed code) ($OUT/depth.json)
#   drafted-B the oracle pair with the draft (n_max 4, the never-wrong cycle: ~4 accepted per round), q8_0 K/V,
#            build B at the same depths ($OUT/drafted.json)
#   benchmarks/device.sh fattn build fatest exact-q8_0 depth-q8_0 ...
set -uo pipefail
O=$OUT; S=$WORK/shm; L=$WORK/logs; R=$WORK/recipes; mkdir -p $S $L $R
mountpoint -q $S || mount -t tmpfs -o size=100G tmpfs $S || echo "no tmpfs at $S"
LENGTHS=1k,32k,128k,256k
t() { echo "== $(date +%T) $*"; }
keep_logs() { tar -czf $O/logs.tgz -C $L . 2>/dev/null; }  # the logs travel back as one file
gen() {  # gen DIR ARGS...: one random-weight file set, unless already there
  local d=$1; shift
  [ -f $d/manifest.json ] || { python3 benchmarks/make_fullsize_gguf.py $d --tokenizer "$DEVICE_DIR/tok" "$@" 2>&1 | tail -2; }
}
ln -sfn "$RUNTIME_BIN" $WORK/b1
bin() {  # bin b0|b1: the build's bin folder ($WORK/bN), building b0 first if it is not there yet
  if [ $1 = b0 ] && [ ! -x $WORK/b0/llama-server ]; then
    local t0=$SECONDS d
    bash scripts/build_runtime.sh --cuda --cuda-arch "${CUDA_ARCH:-90}" --without-patch fattn-gqa > $L/build-b0.log 2>&1 \
      || { tail -30 $L/build-b0.log >&2; return 1; }
    d=$(sed -n 's/^build_runtime: runtime ready in //p' $L/build-b0.log)
    ln -sfn "$d" $WORK/b0 && echo "b0 (the series without the fattn-gqa patch): $d ($((SECONDS - t0)) s)" >&2
  fi
  echo $WORK/$1
}
for step in "$@"; do t "$step"; case $step in
build)
  ( gen $S/hq3m --quant hq3m --no-draft; gen $S/oracle --oracle ) > $L/gen.log 2>&1 &
  GEN=$!
  bin b0 >/dev/null || exit 1
  wait $GEN; cat $L/gen.log; ls -la $S/*/ | grep gguf ;;
fatest)
  # upstream's FLASH_ATTN_EXT tests on CUDA0 against the CPU, patched build, every quantized-K/V case (the GQA
  # variant: the 32k-row cases; with GGML_CUDA_FA_GQA_VEC_MAX_BATCH=16 also their batches up to 16 tokens)
  B1=$(bin b1); export LD_LIBRARY_PATH=$B1
  for v in ${FATEST_VARIANTS:-default:X=0}; do  # e.g. FATEST_VARIANTS="default:X=0 batch16:GGML_CUDA_FA_GQA_VEC_MAX_BATCH=16"
    env ${v#*:} timeout 200 $B1/test-backend-ops -o FLASH_ATTN_EXT -b CUDA0 -p "type_K=(q8_0|q4_0)" > $L/fa-test-${v%%:*}.log 2>&1
    echo "test-backend-ops (quantized K/V, ${v%%:*}) rc $?"; grep -E "FAIL|tests passed" $L/fa-test-${v%%:*}.log | tail -3
  done
  # kernel times for GQA 8 / head 256 from the patched build's test binary: MAX_BATCH=0 is the old dispatch
  P="hsk=256,hsv=256,nh=2,nr23=\[8,1\],kv=(1024|32768|131072|262144),nb=(1|5|16),"
  for v in old:GGML_CUDA_FA_GQA_VEC_MAX_BATCH=0 new:X=0 batch16:GGML_CUDA_FA_GQA_VEC_MAX_BATCH=16; do
    env ${v#*:} timeout 60 $B1/test-backend-ops perf -o FLASH_ATTN_EXT -b CUDA0 -p "$P" > $L/fa-perf-${v%%:*}.log 2>&1
  done
  python3 - $L <<'PY' | tee $O/fa-perf.txt
import re, sys
from pathlib import Path
rows = {}
for v in ("old", "new", "batch16"):
    for line in (Path(sys.argv[1]) / f"fa-perf-{v}.log").read_text().splitlines():
        m = re.search(r"kv=(\d+),nb=(\d+),.*type_K=(\w+),.*- +([\d.]+) us/run", line)
        if m:
            rows.setdefault((m[3], int(m[1]), int(m[2])), {})[v] = float(m[4])
print("type kv nb: us/run old new batch16")
for k in sorted(rows):
    print(*k, *(rows[k].get(v) for v in ("old", "new", "batch16")))
PY
  ;;
exact-q8_0|exact-q4_0)
  B0=$(bin b0) || exit 1
  python3 benchmarks/gpu/fattn_bench.py exact $S/hq3m --bins $B0,$(bin b1) --kv ${step#exact-} --depth 32k --json $O/exact.json \
    --logdir $L ;;
depth-q8_0|depth-q4_0|depth-f16)
  kv=${step#depth-}
  for b in b0 b1; do
    [ $kv = f16 ] && [ $b = b0 ] && continue  # f16 K/V never reach the changed code
    B=$(bin $b) || exit 1
    r=$(python3 benchmarks/gpu/fattn_bench.py recipe $R --kv $kv)
    python3 benchmarks/gpu/recipe_bench.py measure $S/hq3m --recipe $r --tag $b-$kv --ctx 262144 --lengths $LENGTHS \
      --llama-bin $B --json $O/depth.json --logdir $L 2>&1 | grep -v "log accounting"
  done ;;
drafted-b0|drafted-b1)
  b=${step#drafted-}; B=$(bin $b) || exit 1
  python3 benchmarks/gpu/fattn_bench.py drafted $S/oracle --bin $B --kv q8_0 --n-max 4 --lengths $LENGTHS \
    --tag drafted-$b-q8_0 --json $O/drafted.json --logdir $L ;;
*) echo "fattn: unknown step $step (build fatest exact-KV depth-KV drafted-b0 drafted-b1)" >&2; exit 2 ;;
esac; keep_logs; done
t done
