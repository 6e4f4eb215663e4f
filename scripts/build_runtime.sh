#!/usr/bin/env bash
# The runtime's build script ships in the package with the patch series (ggufbridge/runtime/native/build_runtime.sh;
# `ggufbridge build-runtime` runs it too). Its options: scripts/build_runtime.sh --help.
exec bash "$(dirname "$0")/../ggufbridge/runtime/native/build_runtime.sh" "$@"
