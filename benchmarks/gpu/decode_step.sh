#!/usr/bin/env bash
# Build benchmarks/gpu/decode_step.cpp against the runtime device.sh built ($RUNTIME_BIN, its patched tree's headers)
# and run it with ARGS; with `ncu A B -- ARGS`: run it twice under ncu (only the timed steps: --cuda-range, cuProfilerStart/Stop; --steps 2),
# once with A's and once with B's arguments appended, and print the kernel time per step by name, B against A.
#   bash benchmarks/gpu/decode_step.sh -m MODEL --kv q8_0 --depths 1024,262144
#   bash benchmarks/gpu/decode_step.sh ncu "--depths 1024" "--depths 262144" -- -m MODEL --kv q8_0
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$(readlink -f "$RUNTIME_BIN")
P=$(basename "$(dirname "$(dirname "$BIN")")")  # .../llama.cpp-V-cuda-pH/build/bin -> its tree src/llama.cpp-V-pH
TREE=${GGUFBRIDGE_CACHE:-$HOME/.cache/ggufbridge}/src/$(echo "$P" | sed -E "s/-(cuda|cpu)-p/-p/")
# keyed by the source too: a warm machine keeps $WORK, and a changed decode_step.cpp must not run the old binary
X=${WORK:-/tmp}/decode_step-$P-$(sha1sum "$HERE/decode_step.cpp" | cut -c1-8)
[ -x "$X" ] || g++ -O2 -std=c++17 "$HERE/decode_step.cpp" -I"$TREE/include" -I"$TREE/ggml/include" -L"$BIN" -lllama \
  -lggml-base -Wl,-rpath,"$BIN" -ldl -o "$X" || exit 1
[ "${1:-}" = ncu ] || exec "$X" "$@"
A=$2; B=$3; shift 4
# the raw CSVs and ncu's own messages go to the work folder (the device brings back only a few files from $OUT)
L=${WORK:-$(mktemp -d)}/ncu-$$; mkdir -p "$L"
for v in A B; do
  # shellcheck disable=SC2086  # the variant's arguments are words
  # kernels launched one by one under ncu (GGML_CUDA_DISABLE_GRAPHS, as decode_profile.py runs them), so each is one
  # profiled launch; a kernel's duration does not depend on how it was launched
  GGML_CUDA_DISABLE_GRAPHS=1 timeout 280 ncu --profile-from-start off --csv --page raw --metrics gpu__time_duration.sum --print-units base \
    --clock-control none "$X" "$@" ${!v} --steps 2 --cuda-range > "$L/$v.csv" 2> "$L/$v.err" || tail -5 "$L/$v.err"
done
grep -h "^==" "$L/A.csv" "$L/A.err" | sort | uniq -c | head -5  # ncu's notes (e.g. "No kernels were profiled")
grep -q '"ID"' "$L/A.csv" || { echo "ncu wrote no kernel table:"; head -c 1500 "$L/A.csv"; tail -c 1500 "$L/A.err"; }
python3 - "$L/A.csv" "$L/B.csv" "$A" "$B" <<'PY'
import sys
from benchmarks.gpu.decode_profile import parse_ncu_csv  # the one reader of ncu's CSV
def kernels(path):  # kernel name -> microseconds per step (2 steps profiled)
    return {k: sum(ns) / 2e3 for k, ns in parse_ncu_csv(open(path).read()).items()}
a, b = kernels(sys.argv[1]), kernels(sys.argv[2])
if not a:  # show what ncu wrote where the table was expected
    t = open(sys.argv[1]).read()
    print(t[t.find('"ID"'):][:1200])
la, lb = sys.argv[3], sys.argv[4]
print(f"kernel time per step: [{la}] {sum(a.values()):.1f} us, [{lb}] {sum(b.values()):.1f} us")
print(f"{'growth':>9}  {'A us':>8}  {'B us':>8}  kernel")
# the 30 largest in either variant (a kernel only one of them runs, e.g. a 1-column and an 8-column template, shows
# in both rows: one with A, one with B)
for k in sorted(set(a) | set(b), key=lambda k: -max(a.get(k, 0), b.get(k, 0)))[:30]:
    print(f"{b.get(k, 0) - a.get(k, 0):9.1f}  {a.get(k, 0):8.1f}  {b.get(k, 0):8.1f}  {k[:110]}")
PY
