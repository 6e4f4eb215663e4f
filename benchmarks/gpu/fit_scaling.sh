#!/usr/bin/env bash
# `quantize --fit-bytes` at growing depth on the device (benchmarks/bench_fit_scaling.py): random-weight targets with
# the 35B-A3B's real widths, 256 experts and the real vocabulary, every llama.cpp pass on the GPU, the host's
# cores for the KL and the quantiser. Run by benchmarks/device.sh (which sets up the Python path, the runtime,
# $WORK, $OUT and $JOBS):
#
#   benchmarks/device.sh fit-scaling LAYERS... [-- BENCH ARGS]    e.g. fit-scaling 2 4, then fit-scaling 8
#
# A call is limited to minutes, so each call measures some sizes and the results file ($WORK/fit-h200.json) keeps
# the earlier calls' sizes on a warm machine; it is copied to $OUT after every size and at the end. A size too long
# for one call (10 layers: the model's generation, its plain Q4_K_M and the --fit-bytes run) keeps its model and its
# Q4_K_M with the time it took (Q4_K_M.time.json): the same call again measures only the --fit-bytes run.
set -uo pipefail
mode=${1:?generate or run}; shift
layers=() extra=()
while [ $# -gt 0 ]; do
  case $1 in --) shift; extra=("$@"); break ;; *) layers+=("$1"); shift ;; esac
done
[ ${#layers[@]} -gt 0 ] || { echo "fit_scaling.sh: which layer counts?" >&2; exit 2; }
if [ "$mode" = generate ]; then  # the first size's source GGUF (I/O: it overlaps the runtime's build)
  exec python3 -c "
import sys; from pathlib import Path; from benchmarks.bench_fit_scaling import build
print(build(Path(sys.argv[1]), int(sys.argv[2]), 256, 'real'))" "$WORK/fit" "${layers[0]}"
fi
res=$WORK/fit-h200.json
df -h "$WORK" | tail -1
# LLAMA_FIRST=1: llama_cpp imported first in every Python process (llama_first/sitecustomize.py), as the figures of
# 2026-12-05 were taken: a CLI process then crashed at its first GPU load without it. The CLI now loads the bindings
# before numpy itself (ggufbridge/cli/__init__.py BINDINGS_FIRST); a run without LLAMA_FIRST checks that it suffices
[ "${LLAMA_FIRST:-0}" = 1 ] && export PYTHONPATH=$PWD/benchmarks/gpu/llama_first${PYTHONPATH:+:$PYTHONPATH}
(while sleep 20; do [ -f "$res" ] && cp "$res" "$OUT/"; done) &
watch=$!
python3 -m benchmarks.bench_fit_scaling --work "$WORK/fit" --layers "${layers[@]}" --experts 256 --vocab real \
  --threads "$JOBS" --out "$res" --drop-sources "${extra[@]}" 2>&1 | tee "$OUT/fit-scaling.log"
rc=${PIPESTATUS[0]}
kill $watch 2>/dev/null
[ -f "$res" ] && cp "$res" "$OUT/"
for d in "$WORK"/fit/L*/; do for f in "$d"/fit-*.log; do cp "$f" "$OUT/$(basename "$d")-$(basename "$f")" 2>/dev/null; done; done
exit "$rc"
