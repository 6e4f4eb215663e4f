#!/usr/bin/env bash
# The chat page's build ships in the package beside the runtime's (ggufbridge/runtime/native/build_ui.sh).
here=${0%/*}; [ "$here" = "$0" ] && here=.  # no dirname: build_ui.sh runs in tests with a PATH of few tools
exec bash "$here/../ggufbridge/runtime/native/build_ui.sh" "$@"
