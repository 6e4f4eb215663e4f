#!/usr/bin/env bash
# Builds llama.cpp's chat page (the Svelte app in the pinned tree's tools/ui) with npm, once per version of its
# sources, into a cache outside the repo. build_runtime.sh embeds the result into llama-server.
#
#   scripts/build_ui.sh UI_SRC_DIR CACHE_DIR
#
# Prints the folder of the built page on stdout (CACHE_DIR/page-KEY, KEY: hash of the UI sources), or nothing when
# the page cannot be built (npm missing, npm failing): one line on stderr says why, exit code 0, so that the runtime
# is still built, without the page. npm runs `npm ci`, which installs exactly the tree's package-lock.json;
# node_modules stays in CACHE_DIR/work between builds and is reinstalled only when the lock file changes.
set -euo pipefail

SRC="${1:?usage: build_ui.sh UI_SRC_DIR CACHE_DIR}"
CACHE="${2:?usage: build_ui.sh UI_SRC_DIR CACHE_DIR}"
[ -f "$SRC/package-lock.json" ] || { echo "build_ui: no package-lock.json in $SRC: no chat page" >&2; exit 0; }

# the page is a function of the UI sources only (not of the C++ patches or the build options)
KEY=$(cd "$SRC" && find . -type f ! -path './node_modules/*' ! -path './dist/*' ! -path './.svelte-kit/*' -print0 \
      | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)
PAGE="$CACHE/page-$KEY"
if [ -f "$PAGE/index.html" ]; then echo "$PAGE"; exit 0; fi

if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
  echo "build_ui: npm not found: llama-server is built without its chat page (install Node.js 20+ with npm, then re-run scripts/setup.sh)" >&2
  exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"   # one UI build at a time (two checkouts setting up together share this cache)
flock 9
if [ -f "$PAGE/index.html" ]; then echo "$PAGE"; exit 0; fi

WORK="$CACHE/work"
LOG="$CACHE/npm.log"
mkdir -p "$WORK"
# fresh sources beside the installed node_modules
find "$WORK" -mindepth 1 -maxdepth 1 ! -name node_modules -exec rm -rf {} +
(cd "$SRC" && tar --exclude=./node_modules --exclude=./dist --exclude=./.svelte-kit -cf - .) | tar -xf - -C "$WORK"

LOCK=$(sha256sum "$WORK/package-lock.json" | cut -c1-64)
: >"$LOG"
if [ "$(cat "$WORK/node_modules/.ggufbridge-lock" 2>/dev/null)" != "$LOCK" ]; then
  echo "build_ui: npm ci (the chat page's dependencies, as locked in the pinned tree; log $LOG)" >&2
  if ! (cd "$WORK" && npm ci --no-audit --no-fund) >>"$LOG" 2>&1; then
    echo "build_ui: npm ci failed (see $LOG): llama-server is built without its chat page" >&2
    exit 0
  fi
  echo "$LOCK" >"$WORK/node_modules/.ggufbridge-lock"
fi

echo "build_ui: npm run build (the chat page; log $LOG)" >&2
rm -rf "$PAGE.tmp"
# LLAMA_UI_OUT_DIR: where the tree's svelte.config.js writes the page (as its CMake build passes it)
if ! (cd "$WORK" && LLAMA_UI_OUT_DIR="$PAGE.tmp" npm run build) >>"$LOG" 2>&1 || [ ! -f "$PAGE.tmp/index.html" ]; then
  rm -rf "$PAGE.tmp"
  echo "build_ui: npm run build failed (see $LOG): llama-server is built without its chat page" >&2
  exit 0
fi
mv "$PAGE.tmp" "$PAGE"
echo "$PAGE"
