#!/usr/bin/env bash
# Sets up a fresh machine (scripts/setup.sh) and runs the test suite. GPU tests (marker `gpu`) need CUDA and are
# run on a GPU machine with: .venv/bin/python -m pytest -m gpu
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -m "not gpu" "$@"
