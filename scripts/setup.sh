#!/usr/bin/env bash
# Sets up a fresh machine: .venv at the repo root with ggufbridge (+ test extras), and the pinned llama.cpp
# runtime built once per machine (cached in ~/.cache/ggufbridge) and bound to the Python bindings, by the build
# script the package ships (ggufbridge/runtime/native/build_runtime.sh, what `ggufbridge build-runtime` runs).
#   scripts/setup.sh [--cuda] [--cuda-arch N] [--perf|--no-perf]     (extra args go to build_runtime.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY="$PWD/.venv/bin/python"
# CPU torch: a pinned version resolves to the local CPU wheel; an unpinned one pulls a multi-GB CUDA build.
"$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
"$VPY" -m pip install -q "torch==2.13.0"
bash ggufbridge/runtime/native/build_runtime.sh --python "$VPY" "$@"
"$VPY" -m pip install -q -e ".[test]"
# the chat page's browser test (tests/test_chat_page.py) drives Debian's Chromium, installed here where missing
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian's chromium for the chat page's browser test"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core; } \
      >/tmp/ggufbridge-chromium.log 2>&1 || echo "setup: chromium could not be installed (log /tmp/ggufbridge-chromium.log)"
  else
    echo "setup: no chromium (and no root apt-get to install it): tests/test_chat_page.py will be skipped"
  fi
fi
echo "setup: ready — .venv/bin/ggufbridge doctor"
