#!/usr/bin/env bash
# The chat page's build ships in the package beside the runtime's (ggufbridge/runtime/native/build_ui.sh).
exec bash "$(dirname "$0")/../ggufbridge/runtime/native/build_ui.sh" "$@"
