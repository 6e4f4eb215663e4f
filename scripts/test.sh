#!/usr/bin/env bash
# Sets up a fresh machine (scripts/setup.sh) and runs the test suite. GPU tests (marker `gpu`) need CUDA and are
# run on the H200 device with scripts/gpu/pytest_gpu.sh (see docs/compare.md, "Tests")
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -m "not gpu" "$@"
