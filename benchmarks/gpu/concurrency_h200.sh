#!/usr/bin/env bash
# Device job `benchmarks/device.sh streams STEP...` (issue 28): many clients at once on one H200, at the real
# 35B-A3B shapes, on the runtime device.sh built (with --target llama-batched-bench).
# Steps, in order (each skips what is already there, so a warm machine resumes); `all` = build timing bench bench-off
# bench-host bench-draft: the series against its own performance patches off, in one build (~10 min on a bare machine
# with the runtime build, most of it the build; the steps most worth having come first, so a call cut short keeps
# them). Before/after steps of patches that have since joined the series are gone (benchmarks/README.md says which);
# their results are in git history:
#   build        the file set (make_fullsize_gguf.py, random weights, its DSpark draft) on a RAM-backed tmpfs: hq3m
#                (the issue's), or STREAMS_QUANT=q4_k_m / q8_0 (the h200 recipe's own files)
#   build-target the same without the draft (for the target-only steps: ~30 s instead of ~70)
#   timing       the decode step alone, no server and no sampling: llama-batched-bench at 1, 2, 4, 8, 16 sequences
#                (decode_profile.py --timing-only); $OUT/decode-timing-h200.json
#   timing-kvu   the same with the server's KV layout, one unified pool (-kvu): each query spans every slot's cells
#                (the server's step beside `timing`'s); $OUT/decode-timing-kvu.json
#   bench-off    `bench` with every performance patch of the series that has an off switch off ($CAND_OFF: the
#                decode kernels 0017-0020 and 0022, 0021's span copy, 0023's greedy chain, 0024's in-place state
#                read, and the candidates): the anchor beside `bench` in one build; $OUT/concurrency-off/*
#   bench        `ggufbridge bench --concurrency 1,2,4,8 --repeats 3` on that file, target only, the h200 recipe as shipped
#                (its sampler chains in the graph: server.backend_sampling) with q8_0 KV as the table: one
#                llama-server with -np 8 (the planner's slots: a unified pool, each slot capped at its context),
#                1k-token prompts, 128 generated tokens per stream; $OUT/concurrency/*
#   bench-run2, bench-run3  `bench` again, into $OUT/concurrency-run2/*, $OUT/concurrency-run3/* (a median of 3);
#                bench-off-run2, bench-off-run3 the same for `bench-off`
#   bench-host   the same with each slot's sampler chain on the server thread between decodes
#                (backend_sampling = false: the runtime's default, the before-table); $OUT/concurrency-host/*
#   eval-fa      test-backend-ops on CUDA0: FLASH_ATTN_EXT (the unified-pool cases, every q8_0/q4_0 case), TOP_K
#   bench-draft  `--concurrency 1,4 --draft`: drafted text = target-only text per stream at full shape (the CPU
#                test's H200 form) and the drafted speed at 4 streams; $OUT/concurrency-draft/*
#   where        the step at 1, 2, 4, 8, 16 sequences taken apart, no server (decode_step.cpp): time in llama_decode
#                (host), the whole step ($OUT/step-width.jsonl); kernels of two steps at 1 and 8 sequences by name,
#                from ncu ($OUT/step-width-kernels.txt); the width sweep again at 1 and 8 without CUDA graphs
#   sampler-split the step alone without and with llama-server's sampler chain in the graph (top_k 1 and 40) at
#                1-8 sequences, and its kernels by name at 8 (ncu): the GPU's part of the served step's excess;
#                the same for series patch 0023's greedy chain (SAMPLER_NCU=0: the timings without the ncu part)
#                ($OUT/step-sampler.jsonl, $OUT/step-sampler-kernels.txt, $OUT/step-sampler-greedy-kernels.txt)
#   kernel-logits the Hopper decode kernels on and off ($CAND_OFF) on the same inputs at 2, 4, 8 sequences: KL, top-1
#                and the largest logit difference (decode_step --logits-out, logits_compare.py); $OUT/kernel-logits.txt
#   kernels      the same kernel split on a 4-layer proxy (quick to write and to profile; $OUT/step-proxy4-kernels.txt)
#                and test-backend-ops' MoE mat-vec timings at 1, 4, 8 tokens
#   crossover    MMVQ against MMQ at the model's shapes, 1-9 and 16 columns (test-backend-ops perf with the cases of
#                benchmarks/gpu/test-backend-ops-qwen35-decode-perf.patch: a test-backend-ops built here from the
#                patched tree against this runtime, carried xz-compressed as .dev/tbo/tbo.xz; benchmarks/README.md);
#                MUL_MAT_ID (~1 min; CROSSOVER_OPS="MUL_MAT_ID MUL_MAT" adds the dense cases, ~5 min more);
#                $OUT/mmid.txt, $OUT/mm.txt
#   profile      one decode step at 1 and 8 sequences kernel by kernel (ncu, decode_profile.py; slow: ncu
#                serialises ~1,700 kernels per step, run it alone); $OUT/decode-profile-h200.json
# With STREAMS_CANDIDATES=1 (device.sh: the runtime is the series and then the not-applied patches STREAMS_CANDIDATE_FILES names, with
# test-backend-ops and its decode perf cases; the candidates' kernel table moe-kernel.txt and the target file are
# made during the build) six more steps; each candidate has a variable that turns it off ($CAND_OFF), so the same
# build is the series (before) and the series with the candidates (after):
#   eval         test-backend-ops on CUDA0 against the CPU: MUL_MAT_ID, MUL_MAT_VEC_FUSION (fused gate/GLU with
#                expert ids, 2-8 tokens), MUL_MAT_ID_FUSION with the shaped MoE kernel, TOP_K (0020), MUL_MAT for
#                the types the crossover row names and F32; $OUT/eval.txt
#   bench        (above): the series with the candidates on (their defaults)
#   state-span   series patch 0021's state save (benchmarks/state_span_check.py at 8 x 1k + 128 steps): the bytes
#                with and without the span copy, and the save times; $OUT/state-span.txt
#   bench-series `bench` with the candidates off, the series as shipped (the before of a candidate);
#                $OUT/concurrency-series/*
#   cand-timing  the decode step alone (llama-batched-bench) at 1-8 sequences with the Hopper decode kernels off, on,
#                the MoE kernels alone, the shaped one alone, the Q6_K multi-column one alone, and the series as
#                shipped (candidates off); $OUT/cand-timing.txt
#   cand-perf    kernel times with each candidate off and on (test-backend-ops perf, the model's shapes at 2/4/8
#                columns); $OUT/cand-perf.txt
#   benchmarks/device.sh streams all
# Results are written to $WORK/out ($O below; "$OUT/x" in the step list means "$O/x") and come back as one file,
# $OUT/results.tgz, refreshed after every step (the device returns at most 8 files; a call cut short keeps the
# steps it finished).
set -uo pipefail
O=$WORK/out; S=$WORK/shm; L=$WORK/logs; R=$WORK/recipes; mkdir -p $O $S $L $R
mountpoint -q $S || mount -t tmpfs -o size=60G tmpfs $S || echo "no tmpfs at $S"
# the table: the h200 recipe with a q8_0 KV cache; and the same with sampling on the server thread
printf 'base = "h200"\nname = "h200-q8kv"\n[server]\ncache_type_k = "q8_0"\ncache_type_v = "q8_0"\n' > $R/h200-q8kv.toml
printf 'base = "h200"\nname = "h200-q8kv-host"\n[server]\ncache_type_k = "q8_0"\ncache_type_v = "q8_0"\nbackend_sampling = false\n' \
  > $R/h200-q8kv-host.toml
keep_logs() { tar -czf $OUT/logs.tgz -C $L . 2>/dev/null; tar -czf $OUT/results.tgz -C $O . 2>/dev/null; }
# the candidates off (the series as shipped): multi-column mat-vec (candidate 0026)
SERIES_ONLY="GGML_CUDA_MMVQ_COLS=0"
# every performance patch of the series with an off switch off: the Hopper decode kernels (MoE mat-vecs 0017, whose
# MOE_SHAPED=0 turns the row-per-warp kernels off too; thin F32 0018; crossover row 0019), two-pass top-k (0020),
# state-save span copy (0021), tile skip in the quantized flash attention (0022), the greedy chain (0023), the
# in-place recurrent state read (0024), and the candidates
CAND_OFF="GGML_CUDA_MOE_SHAPED=0 GGML_CUDA_MMVF_THIN_F32=0 GGML_CUDA_MMVQ_HOPPER=0 GGML_CUDA_TOPK_TILES=0
          LLAMA_STATE_SPAN_GET=0 GGML_CUDA_FA_MMA_Q_TILE_SKIP=0 LLAMA_SAMPLER_GREEDY_CHAIN=0 LLAMA_RS_IN_PLACE=0
          $SERIES_ONLY"
tbo() { timeout "$1" "$RUNTIME_BIN/test-backend-ops" "${@:2}" 2>&1 | sed -u -e 's/\x1b\[[0-9;]*m//g'; }
t() { echo "== $(date +%T) $*"; }
# the served measurement on recipe RECIPE into $O/OUT, with the variables VAR=VALUE set (a kernel off):
# bench --concurrency 1,2,4,8 --repeats 3, 1k-token prompts, 128 tokens per stream
cbench() {  # RECIPE OUT [VAR=VALUE...]
  local recipe=$1 out=$2
  shift 2
  env "$@" timeout 240 python3 -m ggufbridge bench $D --recipe $R/$recipe.toml --concurrency 1,2,4,8 --repeats 3 \
    --prompt-lengths 1k -n 128 -o $O/$out 2>&1 | tail -20
}
# the decode step alone (llama-batched-bench through decode_profile.py, no server, no sampling) at 1-16 sequences
# into $O/OUT.json, with llama-batched-bench arguments EXTRA ("": decode_profile.py's, q8_0 K/V) and VAR=VALUE set
ctiming() {  # OUT EXTRA [VAR=VALUE...]
  local out=$1 extra=$2
  shift 2
  env "$@" timeout 240 python3 -m benchmarks.gpu.decode_profile "$RUNTIME_BIN" "$(model)" --timing-only \
    ${extra:+"--extra=$extra"} --timing-npl 1,2,4,8,16 --ntg 64 --json $O/$out.json 2>&1 | tail -20
}
steps=("$@"); [ "${1:-}" = all ] && steps=(build timing bench bench-off bench-host bench-draft)
Q=${STREAMS_QUANT:-hq3m}; D=$S/$Q
model() { echo $D/target.gguf; }
for step in "${steps[@]}"; do t "$step"; case $step in
build)
  [ -f $D/draft.gguf ] || python3 -m benchmarks.make_fullsize_gguf $D --tokenizer "$DEVICE_DIR/tok" \
    --quant $Q 2>&1 | tail -3
  ls -la $D ;;
build-target)
  [ -f $D/manifest.json ] || python3 -m benchmarks.make_fullsize_gguf $D --tokenizer "$DEVICE_DIR/tok" \
    --quant $Q --no-draft 2>&1 | tail -3 ;;
timing) ctiming decode-timing-h200 "" ;;
timing-kvu) ctiming decode-timing-kvu "-ctk q8_0 -ctv q8_0 -kvu" ;;
bench) cbench h200-q8kv concurrency ;;
bench-run2|bench-run3) cbench h200-q8kv concurrency-${step#bench-} ;;  # `bench` again in the same call (run-to-run spread)
bench-host) cbench h200-q8kv-host concurrency-host ;;
bench-draft)
  timeout 300 python3 -m ggufbridge bench $D --recipe $R/h200-q8kv.toml --concurrency 1,4 --draft \
    --prompt-lengths 1k -n 128 -o $O/concurrency-draft 2>&1 | tail -20 ;;
where)
  # the step at 1..16 sequences taken apart, no server, no sampling chain (decode_step.cpp): time in llama_decode
  # (host) and the whole step; then the kernels of two steps at 1 and at 8 sequences by name (ncu)
  M="-m $(model) --kv q8_0 --depths 1024 --slots 16 --ctx 4096"
  bash benchmarks/gpu/decode_step.sh $M --seqs 1,2,4,8,16 --tag width | tee -a $O/step-width.jsonl
  # the same without CUDA graphs: what launching ~1,700 kernels one by one adds at each width
  GGML_CUDA_DISABLE_GRAPHS=1 bash benchmarks/gpu/decode_step.sh $M --seqs 1,8 --tag width-eager \
    | tee -a $O/step-width.jsonl
  bash benchmarks/gpu/decode_step.sh ncu "--seqs 1" "--seqs 8" -- $M | tee $O/step-width-kernels.txt ;;
sampler-split)
  # where the served step's excess over the GPU's goes (issue 28: 10.8 ms while all 8 streams decode, 9.2 in
  # `timing-kvu`): the step alone (decode_step.cpp, 8 slots over a unified pool as llama-server has them) without a
  # sampler, then with the chain llama-server builds for a greedy request in the graph (top_k 1 as `bench` asks, 40
  # the server's default); the difference is the GPU's sampling, the rest of the excess the server thread's. Then
  # the kernels of the 8-sequence step by name without and with the chain (ncu)
  M="-m $(model) --kv q8_0 --depths 1024 --slots 8 --ctx 1280"
  for k in -1 1 40; do
    bash benchmarks/gpu/decode_step.sh $M --seqs 1,2,4,8 --sampler-top-k $k --tag sampler | tee -a $O/step-sampler.jsonl
  done
  # series patch 0023's chain for a greedy request (temperature 0, greedy)
  bash benchmarks/gpu/decode_step.sh $M --seqs 1,2,4,8 --sampler-greedy-chain --tag sampler | tee -a $O/step-sampler.jsonl
  if [ "${SAMPLER_NCU:-1}" != 0 ]; then  # SAMPLER_NCU=0: the timings only
    bash benchmarks/gpu/decode_step.sh ncu "--seqs 8" "--seqs 8 --sampler-top-k 40" -- $M | tee $O/step-sampler-kernels.txt
    bash benchmarks/gpu/decode_step.sh ncu "--seqs 8 --sampler-top-k 1" "--seqs 8 --sampler-greedy-chain" -- $M \
      | tee $O/step-sampler-greedy-kernels.txt
  fi ;;
kernel-logits)
  # the Hopper decode kernels against the pinned ones on the same inputs: decode_step at 2, 4 and 8 sequences (8
  # timed steps of fixed random tokens after 1k-token prompts) once with $CAND_OFF and once as built, every logit
  # kept and compared (KL, top-1, largest difference); $OUT/kernel-logits.txt
  M="-m $(model) --kv q8_0 --depths 1024 --slots 8 --ctx 1280 --steps 8"
  for n in 2 4 8; do
    env $CAND_OFF bash benchmarks/gpu/decode_step.sh $M --seqs $n --logits-out $WORK/logits-off-$n.bin > /dev/null
    bash benchmarks/gpu/decode_step.sh $M --seqs $n --logits-out $WORK/logits-on-$n.bin > /dev/null
    python3 -m benchmarks.gpu.logits_compare $WORK/logits-off-$n.bin $WORK/logits-on-$n.bin "$n sequences, off -> on"
  done | tee $O/kernel-logits.txt ;;
kernels)
  # the step's kernels by name at 1 and 8 sequences on a 4-layer proxy (3 gated delta-net + 1 attention layer at
  # the real widths: a tenth of the model's layers, the whole output head), quick to write and to profile; and
  # llama.cpp's own MoE mat-vec timings at 1, 4 and 8 tokens (test-backend-ops perf, 128 experts of 768 x 2048)
  [ -f $S/p4-$Q/manifest.json ] || python3 -m benchmarks.make_fullsize_gguf $S/p4-$Q --tokenizer "$DEVICE_DIR/tok" \
    --quant $Q --layers 4 --no-draft 2>&1 | tail -2
  M="-m $S/p4-$Q/target.gguf --kv q8_0 --depths 1024 --slots 16 --ctx 4096"
  bash benchmarks/gpu/decode_step.sh $M --seqs 1,8 --tag proxy4 | tee -a $O/step-width.jsonl
  bash benchmarks/gpu/decode_step.sh ncu "--seqs 1" "--seqs 8" -- $M | tee $O/step-proxy4-kernels.txt
  "$RUNTIME_BIN/test-backend-ops" perf -o MUL_MAT_ID -b CUDA0 \
    -p "type_a=(q4_K|q6_K),.*n_mats=128,n_used=8.*m=768,n=(1|4|8)," 2>&1 | grep -E "MUL_MAT_ID|us/run" | head -20 ;;
crossover)
  [ -f .dev/tbo/tbo.xz ] || { echo "crossover: carry .dev/tbo/tbo.xz (benchmarks/README.md)" >&2; exit 2; }
  xz -dc .dev/tbo/tbo.xz > "$RUNTIME_BIN/test-backend-ops-perf" && chmod +x "$RUNTIME_BIN/test-backend-ops-perf"
  for op in ${CROSSOVER_OPS:-MUL_MAT_ID}; do  # n_mats=256: the model's experts; m=...: its dense shapes and head
    p="(m=8192|m=2048|m=512|m=256|m=248320|m=1),n=[0-9]+,k=(2048|4096),"
    [ $op = MUL_MAT_ID ] && p="n_mats=256,n_used=8"
    timeout 400 "$RUNTIME_BIN/test-backend-ops-perf" perf -o $op -b CUDA0 -p "$p" 2>&1 | grep --line-buffered "us/run" \
      | sed -u -e 's/\x1b\[[0-9;]*m//g' > $O/$([ $op = MUL_MAT_ID ] && echo mmid || echo mm).txt
  done ;;
eval)
  { echo "# the MoE mat-vec kernels (series patch 0017: shapes by the matrix's form, row-per-warp)"
    for op in MUL_MAT_ID MUL_MAT_VEC_FUSION MUL_MAT_ID_FUSION; do
      tbo 120 -o $op -b CUDA0 | grep -E "FAIL|tests passed|Backend CUDA0: "
    done
    echo "# TOP_K (series patch 0020: rows of up to 2^19 + 11 values, ties)"
    tbo 120 -o TOP_K -b CUDA0 | grep -E "FAIL|tests passed"
    echo "# MUL_MAT (the crossover row's types, F32)"
    tbo 200 -o MUL_MAT -b CUDA0 -p "type_a=(f32|q3_K|q4_K|q5_K|q6_K|q8_0),type_b=f32" | grep -E "FAIL|tests passed"
  } | tee $O/eval.txt ;;
bench-off) cbench h200-q8kv concurrency-off $CAND_OFF ;;
bench-off-run2|bench-off-run3) cbench h200-q8kv concurrency-off-${step#bench-off-} $CAND_OFF ;;
eval-fa)
  # the quantized flash attention with the tile skip (0022) against the CPU: the unified-pool masks (n_seq=) and
  # every q8_0 / q4_0 K/V case
  { tbo 90 -o FLASH_ATTN_EXT -b CUDA0 -p "n_seq=" | grep -E "FAIL|tests passed"
    tbo 150 -o FLASH_ATTN_EXT -b CUDA0 -p "type_K=q(8_0|4_0)" | grep -E "FAIL|tests passed"
    tbo 90 -o TOP_K -b CUDA0 | grep -E "FAIL|tests passed"; } | tee $O/eval-fa.txt ;;
state-span)
  # series patch 0021: 8 sequences of 1k-token prompts decoded 128 steps together in one pool, then each one's state
  # saved (what llama-server's idle-slot save does), with one copy per cell range and with the span copy: equal
  # bytes, and the save times
  LLAMA_CPP_LIB_PATH=$RUNTIME_BIN timeout 300 python3 -m benchmarks.state_span_check "$(model)" --gpu --seqs 8 \
    --prompt 1024 --steps 128 2>&1 | tee $O/state-span.txt ;;
bench-series) cbench h200-q8kv concurrency-series $SERIES_ONLY ;;
cand-timing)
  # the decode step alone (llama-batched-bench, no server) at 1, 2, 4, 8 sequences with the Hopper decode kernels
  # (series patches 0017-0019 and the candidates) off, all on, the MoE kernels alone (row-per-warp and shaped), the
  # shaped MoE kernel alone (row-per-warp off), the Q6_K multi-column mat-vec alone, and the series as shipped (the
  # candidates off); $OUT/cand-timing.txt, $OUT/decode-timing-<config>.json
  T="GGML_CUDA_MMVQ_HOPPER=0 GGML_CUDA_MMVF_THIN_F32=0"
  for v in "off:$CAND_OFF" "on:" "moe-only:$T GGML_CUDA_MMVQ_COLS=0" \
           "shaped-only:$T GGML_CUDA_MMVQ_COLS=0 GGML_CUDA_MOE_ROWWARP=0" "cols-only:$T GGML_CUDA_MOE_SHAPED=0" \
           "series:$SERIES_ONLY"; do
    env ${v#*:} timeout 120 python3 -m benchmarks.gpu.decode_profile "$RUNTIME_BIN" "$(model)" --timing-only \
      --timing-npl 1,2,4,8 --ntg 64 --json $O/decode-timing-${v%%:*}.json > $L/timing-${v%%:*}.log 2>&1
  done
  python3 -m benchmarks.gpu.cand_timing $O | tee $O/cand-timing.txt ;;
cand-perf)
  { # the MoE mat-vec at the model's expert shapes: stock (0) and the shaped kernel (1)
    for shape in 0 1; do
      echo "# GGML_CUDA_MOE_SHAPED=$shape"
      GGML_CUDA_MOE_SHAPED=$shape tbo 60 perf -o MUL_MAT_ID -b CUDA0 -p "n_mats=256,n_used=8,.*n=(2|4|8)," | grep "us/run"
    done
    # the dense matrices (8192 rows and the head) and the thin F32 ones: all off, the multi-column Q6_K and thin F32
    # kernels, and those with the crossover row (which sends the large ones to MMQ from some column count)
    for v in "GGML_CUDA_MMVQ_HOPPER=0 GGML_CUDA_MMVF_THIN_F32=0 GGML_CUDA_MMVQ_COLS=0" \
             "GGML_CUDA_MMVQ_HOPPER=0 GGML_CUDA_MMVF_THIN_F32=1 GGML_CUDA_MMVQ_COLS=1" \
             "GGML_CUDA_MMVQ_HOPPER=1 GGML_CUDA_MMVF_THIN_F32=1 GGML_CUDA_MMVQ_COLS=1"; do
      echo "# $v"
      # (the types of the model's files only: every type at the head's 248,320 rows outlasted a 7-minute call)
      env $v timeout 90 "$RUNTIME_BIN/test-backend-ops" perf -o MUL_MAT -b CUDA0 \
        -p "type_a=(f32|q3_K|q4_K|q6_K|q8_0),.*(m=8192|m=248320|m=256|m=1),n=(4|6|8),k=2048," 2>&1 \
        | sed -e 's/\x1b\[[0-9;]*m//g' | grep "us/run"
    done
  } | tee $O/cand-perf.txt ;;
profile)
  timeout 580 python3 -m benchmarks.gpu.decode_profile "$RUNTIME_BIN" "$(model)" \
    --npl 1,8 --json $O/decode-profile-h200.json 2>&1 | tail -20 ;;
*) echo "streams: unknown step $step (all build build-target timing timing-kvu where sampler-split kernel-logits kernels bench bench-off
   bench-run2 bench-run3 bench-off-run2 bench-off-run3 bench-host bench-draft eval-fa crossover profile; with STREAMS_CANDIDATES=1: eval
   state-span bench-series cand-timing cand-perf)" >&2
   exit 2 ;;
esac; keep_logs; done
t done
