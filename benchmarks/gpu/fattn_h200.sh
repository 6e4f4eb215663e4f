#!/usr/bin/env bash
# Device command (issue 24): flash-attention decode at depth with quantized K/V, the series without and with the
# GQA patch (patches/llama.cpp/*fattn-gqa*) built side by side. Run from a copy of this checkout whose parent holds
# llama-src.tgz, whl/ and tok/ (benchmarks/gpu/fattn_prep.sh stages all of it as .dev/h24, carried with `carry`):
#   cd .dev/h24/repo && bash benchmarks/gpu/fattn_h200.sh STEP...
# Steps (build skips what a warm machine already has):
#   build    both runtimes (/root/b0: the series without the patch; /root/b1: with it; llama-server and
#            test-backend-ops, sm_90: one build, then the patch and an incremental rebuild) beside the files:
#            the hq3m random-weight target (17.48 GB) and the oracle pair (make_fullsize_gguf.py --oracle)
#   fatest   upstream test-backend-ops -o FLASH_ATTN_EXT on CUDA0 against the CPU (patched build), and kernel
#            times at GQA 8 / head 256 of the old dispatch, the new one, and the GQA variant for batches up to
#            16 tokens ($OUT/fa-perf.txt)
#   exact-KV greedy 64 tokens at 32k depth, both builds: identical tokens, top-20 KL ($OUT/exact.json)
#   depth-KV target-only decode at 1k/32k/128k/256k (hq3m, the h200 recipe's flags with K/V type KV), both
#            builds (f16: the patched one only, f16 K/V never reach the changed code) ($OUT/depth.json)
#   drafted-B the oracle pair with the draft (n_max 4, the never-wrong cycle: ~4 accepted per round), q8_0 K/V,
#            build B at the same depths ($OUT/drafted.json)
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
H=$(cd .. && pwd); O=${OUT:-/tmp/out}; mkdir -p "$O"
S=/root/shm; L=/root/logs; mkdir -p $S $L  # logs travel back as $OUT/logs.tgz (8 files at most)
mountpoint -q $S || mount -t tmpfs -o size=100G tmpfs $S || echo "no tmpfs at $S"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$H"/whl/*.whl \
  >/dev/null 2>&1 || true
export PYTHONPATH=/tmp/site:$PWD
LENGTHS=1k,32k,128k,256k
t() { echo "== $(date +%T) $*"; }
gen() {  # gen DIR ARGS...: one random-weight file set, unless already there
  local d=$1; shift
  [ -f $d/manifest.json ] || { python3 benchmarks/make_fullsize_gguf.py $d --tokenizer /root/tok "$@" 2>&1 | tail -2; }
}
PATCHES=$(ls patches/llama.cpp/[0-9][0-9][0-9][0-9]-*.patch | grep -v fattn-gqa)
GQA=$(ls patches/llama.cpp/[0-9][0-9][0-9][0-9]-*fattn-gqa*.patch)
TREE=/root/src/llama_cpp_python-0.3.36/vendor/llama.cpp
for step in "$@"; do t "$step"; case $step in
build)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  # the Qwen3.5 tokenizer as ggufbridge.testkit.vocab.write_tokenizer writes it (carried as tok/, gzipped)
  [ -f /root/tok/tokenizer.json ] || { mkdir -p /root/tok && cp "$H"/tok/* /root/tok/ && gunzip -f /root/tok/tokenizer.json.gz; }
  ( gen $S/hq3m --quant hq3m --no-draft; gen $S/oracle --oracle ) > $L/gen.log 2>&1 &
  GEN=$!
  if [ ! -x /root/b1/llama-server ]; then
    T0=$(date +%s)
    rm -rf /root/src && mkdir -p /root/src && tar -xzf "$H/llama-src.tgz" -C /root/src
    for p in $PATCHES; do patch -p1 --forward --batch --quiet -d $TREE < $p || { echo "patch $p failed"; exit 1; }; done
    cmake -S $TREE -B /root/bld -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
      -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > $L/configure.log 2>&1 \
      || { tail -20 $L/configure.log; exit 1; }
    cmake --build /root/bld -j 16 --target llama-server test-backend-ops > $L/build0.log 2>&1 || { tail -30 $L/build0.log; exit 1; }
    rm -rf /root/b0 && cp -a /root/bld/bin /root/b0
    echo "build without the patch: $(( $(date +%s) - T0 )) s"
    patch -p1 --forward --batch -d $TREE < $GQA || { echo "patch $GQA failed"; exit 1; }
    cmake --build /root/bld -j 16 --target llama-server test-backend-ops > $L/build1.log 2>&1 || { grep -m5 -B2 -A8 "error" $L/build1.log; exit 1; }
    rm -rf /root/b1 && cp -a /root/bld/bin /root/b1
    echo "both builds: $(( $(date +%s) - T0 )) s"
  fi
  wait $GEN; cat $L/gen.log; ls -la $S/*/ | grep gguf ;;
fatest)
  # upstream's FLASH_ATTN_EXT tests on CUDA0 against the CPU, patched build, every quantized-K/V case (the GQA
  # variant: the 32k-row cases; with GGML_CUDA_FA_GQA_VEC_MAX_BATCH=16 also their batches up to 16 tokens)
  export LD_LIBRARY_PATH=/root/b1
  for v in ${FATEST_VARIANTS:-default:X=0}; do  # e.g. FATEST_VARIANTS="default:X=0 batch16:GGML_CUDA_FA_GQA_VEC_MAX_BATCH=16"
    env ${v#*:} timeout 200 /root/b1/test-backend-ops -o FLASH_ATTN_EXT -b CUDA0 -p "type_K=(q8_0|q4_0)" > $L/fa-test-${v%%:*}.log 2>&1
    echo "test-backend-ops (quantized K/V, ${v%%:*}) rc $?"; grep -E "FAIL|tests passed" $L/fa-test-${v%%:*}.log | tail -3
  done
  # kernel times for GQA 8 / head 256 from the patched build's test binary: MAX_BATCH=0 is the old dispatch
  P="hsk=256,hsv=256,nh=2,nr23=\[8,1\],kv=(1024|32768|131072|262144),nb=(1|5|16),"
  for v in old:GGML_CUDA_FA_GQA_VEC_MAX_BATCH=0 new:X=0 batch16:GGML_CUDA_FA_GQA_VEC_MAX_BATCH=16; do
    env ${v#*:} timeout 60 /root/b1/test-backend-ops perf -o FLASH_ATTN_EXT -b CUDA0 -p "$P" > $L/fa-perf-${v%%:*}.log 2>&1
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
  python3 benchmarks/gpu/fattn_bench.py exact $S/hq3m --bins /root/b0,/root/b1 --kv ${step#exact-} --depth 32k --json $O/exact.json ;;
depth-q8_0|depth-q4_0|depth-f16)
  kv=${step#depth-}
  for b in b0 b1; do
    [ $kv = f16 ] && [ $b = b0 ] && continue  # f16 K/V never reach the changed code
    r=$(python3 benchmarks/gpu/fattn_bench.py recipe /root/recipes --kv $kv)
    python3 benchmarks/gpu/recipe_bench.py measure $S/hq3m --recipe $r --tag $b-$kv --ctx 262144 --lengths $LENGTHS \
      --llama-bin /root/$b --json $O/depth.json --logdir $L 2>&1 | grep -v "log accounting"
  done ;;
drafted-b0|drafted-b1)
  b=${step#drafted-}
  python3 benchmarks/gpu/fattn_bench.py drafted $S/oracle --bin /root/$b --kv q8_0 --n-max 4 --lengths $LENGTHS \
    --tag drafted-$b-q8_0 --json $O/drafted.json --logdir $L ;;
esac; tar -czf $O/logs.tgz -C $L . 2>/dev/null; done
t done
