#!/usr/bin/env bash
# Device job `benchmarks/device.sh fattn STEP...` (issue 24): decode at depth with quantized K/V, without (b0) and
# with (b1) the patches for it: the GQA kernel (ggufbridge/runtime/native/llama.cpp-perf/*fattn-gqa*) and the KQ-mask fill
# (*mask-seq-summary*). b1 is the runtime device.sh built or unpacked (with test-backend-ops); by default b0 is the
# same binaries with GGML_CUDA_FA_MMA_Q_MAX_BATCH=0 (the kernel patch adds one branch in front of the stock kernel
# choice, so with it off every call takes the stock kernel; the mask patch stays). FATTN_B0=build builds the series
# without both patches instead, in its own cache folder: a second full build, the anchor docs/benchmarks.md reports.
# Steps (each skips what a warm machine already has):
#   build    the files: the hq3m random-weight target (17.48 GB) and the oracle pair (make_fullsize_gguf.py
#            --oracle), on a RAM-backed tmpfs; b0 too if FATTN_B0=build
#   kernel   the patch's kernel alone (benchmarks/gpu/fattn_kernel): against an f32 reference, and its times beside
#            a device copy of the same K/V bytes ($OUT/fattn-kernel.txt)
#   fatest   upstream test-backend-ops -o FLASH_ATTN_EXT on CUDA0 against the CPU (b1) for every GQA 8/16 case with
#            quantized K/V, and kernel times at GQA 8 / head 256 for b0 and b1 ($OUT/fa-perf.txt)
#   exact-KV greedy 64 tokens at 32k depth: b0, b0 again (the noise floor), b1: identical tokens, top-20 KL
#            against the first run ($OUT/exact.json)
#   depth-KV target-only decode at $LENGTHS (1k/32k/128k/250k) (hq3m, the h200 recipe's flags with K/V type KV), b0 and b1
#            (f16 K/V never reach the kernel: b0 only when it is a build, for the mask patch) ($OUT/depth.json)
#   where-KV  one decode step at each depth taken apart, no server (decode_step.cpp): time in llama_decode (host),
#            the whole step ($OUT/where.jsonl)
#   kernels-KV the kernels of two steps at 1k and 256k by name, from ncu ($OUT/where-kernels-KV.txt)
#   drafted-B the oracle pair with the draft (n_max 4, the never-wrong cycle: ~4 accepted per round), q8_0 K/V,
#            build B at the same depths ($OUT/drafted.json)
#   benchmarks/device.sh fattn build kernel fatest exact-q8_0 depth-q8_0 ...
set -uo pipefail
O=$OUT; S=$WORK/shm; L=$WORK/logs; R=$WORK/recipes; mkdir -p $S $L $R
mountpoint -q $S || mount -t tmpfs -o size=100G tmpfs $S || echo "no tmpfs at $S"
LENGTHS=${FATTN_LENGTHS:-1k,32k,128k,250k}  # the issue's depths (250k = 256,000 tokens)
t() { echo "== $(date +%T) $*"; }
keep_logs() { tar -czf $O/logs.tgz -C $L . 2>/dev/null; }  # the logs travel back as one file
gen() {  # gen DIR ARGS...: one random-weight file set, unless already there
  local d=$1; shift
  [ -f $d/manifest.json ] || { python3 -m benchmarks.make_fullsize_gguf $d --tokenizer "$DEVICE_DIR/tok" "$@" 2>&1 | tail -2; }
}
ln -sfn "$RUNTIME_BIN" $WORK/b1
OFF=GGML_CUDA_FA_MMA_Q_MAX_BATCH=0  # the patch's kernel off: the stock kernel choice
bin() {  # bin b0|b1: the build's bin folder ($WORK/bN); b0 is b1 unless FATTN_B0=build (then built first)
  if [ $1 = b0 ] && [ "${FATTN_B0:-}" = build ] && [ ! -x $WORK/b0/llama-server ]; then
    local t0=$SECONDS d
    bash scripts/build_runtime.sh --cuda --cuda-arch "${CUDA_ARCH:-90}" --without-patch fattn-gqa \
      --without-patch mask-seq-summary --target llama-batched-bench > $L/build-b0.log 2>&1 \
      || { tail -30 $L/build-b0.log >&2; return 1; }
    d=$(sed -n 's/^build_runtime: runtime ready in //p' $L/build-b0.log)
    ln -sfn "$d" $WORK/b0 && echo "b0 (the series without the fattn-gqa and mask-seq-summary patches): $d ($((SECONDS - t0)) s)" >&2
  fi
  if [ $1 = b0 ] && [ "${FATTN_B0:-}" != build ]; then echo $WORK/b1; else echo $WORK/$1; fi
}
benv() {  # benv b0|b1: the environment that makes the build what its name says
  if [ $1 = b0 ] && [ "${FATTN_B0:-}" != build ]; then echo $OFF; else echo GGUFBRIDGE_BUILD=$1; fi
}
for step in "$@"; do t "$step"; case $step in
build)
  # hq3m with its draft: the same files as the streams job's, so either job runs after the other on a warm machine
  ( gen $S/hq3m --quant hq3m; gen $S/oracle --oracle ) > $L/gen.log 2>&1 &
  GEN=$!
  if [ "${FATTN_B0:-}" = build ]; then bin b0 >/dev/null || exit 1; fi
  wait $GEN; cat $L/gen.log; ls -la $S/*/ | grep gguf ;;
kernel)
  # the patched tree build_runtime.sh built b1 from: its build folder's name without the variant
  P=$(basename "$(dirname "$(dirname "$(readlink -f "$RUNTIME_BIN")")")")  # .../llama.cpp-V-cuda-pH/build/bin
  bash benchmarks/gpu/fattn_kernel/run.sh "${GGUFBRIDGE_CACHE:-$HOME/.cache/ggufbridge}/src/${P/-cuda-/-}" $O 2>&1 | tail -45 ;;
fatest)
  # upstream's FLASH_ATTN_EXT tests on CUDA0 against the CPU, patched build: every GQA 8/16 case with quantized K/V
  # (the patch's kernel: 1-16 tokens, 1k and 32k K/V rows, sinks, two sequences, a permuted layout)
  B1=$(bin b1); export LD_LIBRARY_PATH=$B1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  timeout 300 $B1/test-backend-ops -o FLASH_ATTN_EXT -b CUDA0 -p "nr23=\[(8|16),[0-9]\].*type_K=(q8_0|q4_0)" \
    > $L/fa-test.log 2>&1
  echo "test-backend-ops (GQA 8/16, quantized K/V) rc $?"; grep -E "FAIL|tests passed" $L/fa-test.log | tail -5
  # kernel times for GQA 8 / head 256 from the patched build's test binary, with the patch's kernel off (b0) and on
  P="hsk=256,hsv=256,nh=2,nr23=\[8,1\],kv=(1024|32768|131072|262144),nb=(1|5|16),"
  # one binary, so the kernel-off column is always the env switch (FATTN_B0=build changes only the other steps' b0)
  env $OFF timeout 90 $B1/test-backend-ops perf -o FLASH_ATTN_EXT -b CUDA0 -p "$P" > $L/fa-perf-b0.log 2>&1
  timeout 90 $B1/test-backend-ops perf -o FLASH_ATTN_EXT -b CUDA0 -p "$P" > $L/fa-perf-b1.log 2>&1
  python3 - $L <<'PY' | tee $O/fa-perf.txt
import re, sys
from pathlib import Path
rows = {}
for v in ("b0", "b1"):
    for line in (Path(sys.argv[1]) / f"fa-perf-{v}.log").read_text().splitlines():
        m = re.search(r"kv=(\d+),nb=(\d+),.*type_K=(\w+),.*- +([\d.]+) us/run", line)
        if m:
            rows.setdefault((m[3], int(m[1]), int(m[2])), {})[v] = float(m[4])
print("type kv nb: us/run b0 b1")
for k in sorted(rows):
    print(*k, *(rows[k].get(v) for v in ("b0", "b1")))
PY
  ;;
exact-q8_0|exact-q4_0)
  B0=$(bin b0) || exit 1
  python3 -m benchmarks.gpu.fattn_bench exact $S/hq3m --bins $B0,$B0,$(bin b1) --envs "$(benv b0),$(benv b0),$(benv b1)" \
    --kv ${step#exact-} --depth 32k --json $O/exact.json --logdir $L ;;
depth-q8_0|depth-q4_0|depth-f16)
  kv=${step#depth-}
  for b in b0 b1; do
    # f16 K/V never reach the kernel: with b0 the env switch, b0 would be b1
    [ $kv = f16 ] && [ $b = b0 ] && [ "${FATTN_B0:-}" != build ] && continue
    B=$(bin $b) || exit 1
    r=$(python3 -m benchmarks.gpu.fattn_bench recipe $R --kv $kv)
    env $(benv $b) python3 -m benchmarks.gpu.recipe_bench measure $S/hq3m --recipe $r --tag $b-$kv --ctx 262144 \
      --lengths $LENGTHS --llama-bin $B --json $O/depth.json --logdir $L 2>&1 | grep -v "log accounting"
  done ;;
where-q8_0|where-q4_0|where-f16)
  # one decode step at 1k..256k taken apart, no server (decode_step.cpp on b1, and b0 when it is a build): time in
  # llama_decode (host) and the whole step; kernels-KV: the kernels of two steps at 1k and at 256k by name (ncu)
  for b in b0 b1; do
    [ $b = b0 ] && [ "${FATTN_B0:-}" != build ] && continue  # the host part differs only between builds
    B=$(bin $b) || exit 1
    RUNTIME_BIN=$B bash benchmarks/gpu/decode_step.sh -m $S/hq3m/target.gguf --kv ${step#where-} \
      --depths 1024,32768,131072,262144 --tag $b | tee -a $O/where.jsonl
  done ;;
kernels-q8_0|kernels-q4_0|kernels-f16)
  kv=${step#kernels-}
  bash benchmarks/gpu/decode_step.sh ncu "--depths 1024" "--depths 262144" -- -m $S/hq3m/target.gguf --kv $kv \
    | tee $O/where-kernels-$kv.txt ;;
drafted-b0|drafted-b1)
  b=${step#drafted-}; B=$(bin $b) || exit 1
  env $(benv $b) python3 -m benchmarks.gpu.fattn_bench drafted $S/oracle --bin $B --kv q8_0 --n-max 4 \
    --lengths $LENGTHS --tag drafted-$b-q8_0 --json $O/drafted.json --logdir $L ;;
*) echo "fattn: unknown step $step (build kernel fatest exact-KV depth-KV where-KV kernels-KV drafted-b0 drafted-b1)" >&2; exit 2 ;;
esac; keep_logs; done
t done
