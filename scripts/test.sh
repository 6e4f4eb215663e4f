#!/usr/bin/env bash
# Sets up a fresh machine (scripts/setup.sh), lints (ruff, configured in pyproject.toml) and runs the test suite.
# GPU tests (marker `gpu`) need CUDA and run on the H200 device: `benchmarks/device.sh pytest` (benchmarks/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
# -n auto: a worker per core and one more, one test file per worker at a time, longest files first (tests/conftest.py)
exec .venv/bin/python -m pytest -q -m "not gpu" -n "${PYTEST_WORKERS:-auto}" --dist loadfile "$@"
