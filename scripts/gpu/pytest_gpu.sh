#!/usr/bin/env bash
# Device command: the `gpu` tests (carry .whl, .dev/gpu3 and gpu_exl3/device/ext; see pytest_gpu_prep.sh and
# exl3_prep.sh). The libraries go where their RUNPATH (the build folder here) points.
set -uo pipefail
. "$(dirname "$0")/common.sh"
install_wheels .whl/*.whl .dev/gpu3/whl/*.whl || exit 1
B=/root/.cache/ggufbridge/llama.cpp-0.3.36-cpu/build/bin
mkdir -p $B && cp .dev/gpu3/bin/* $B/ && for f in $B/*.so.0; do ln -sf $f ${f%.0}; done
mkdir -p /tmp/py && cp -r .dev/gpu3/llama_cpp /tmp/py/ && ln -sfn $B /tmp/py/llama_cpp/lib
export PYTHONPATH=/tmp/site:/tmp/py:$PWD PYTHONUNBUFFERED=1
use_carried_exllamav3_ext gpu_exl3/device/ext/exllamav3_ext.so.gz
python3 -m pytest -p no:cacheprovider -v -m gpu "${@:-tests}" 2>&1 | tee ${OUT:-/tmp}/pytest.log
