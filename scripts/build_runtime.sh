#!/usr/bin/env bash
# The runtime's build script ships in the package with the patch series (ggufbridge/runtime/native/build_runtime.sh;
# `ggufbridge build-runtime` runs it too). Its options: scripts/build_runtime.sh --help.
here=${0%/*}; [ "$here" = "$0" ] && here=.  # no dirname: build_ui.sh runs in tests with a PATH of few tools
exec bash "$here/../ggufbridge/runtime/native/build_runtime.sh" "$@"
