#!/usr/bin/env bash
# The patch series (patches/llama.cpp/NNNN-name.patch) as git commits over the pristine pinned tree, and back.
# Edit the series in the git copy, never the .patch files by hand:
#
#   scripts/patches.sh apply  [DIR]   a git copy of the pinned tree in DIR with one commit per patch, in order
#                                     (tag `pinned` = the pristine tree; each commit's note = its file name)
#   scripts/patches.sh export [DIR]   write DIR's commits since `pinned` back as the series, renumbered 0001..N
#   scripts/patches.sh check          apply + export into a scratch folder: the series must come back unchanged
#
# DIR defaults to .dev/llama.cpp-series. In DIR: fix a patch with `git commit --fixup=<its commit>` and
# `git rebase -i --autosquash pinned`, add one with a commit whose message is "<subsystem>: what" plus a why-body
# (name its file with `git notes add -m NNNN-short-name.patch`; otherwise format-patch's slug of the subject is
# used), reorder with `git rebase -i pinned`. Patches from two branches that both added an 0007: apply the merged
# folder (files apply in name order) and export: the numbers come out consecutive again.
# The files are format-patch output (From/Date/Subject, the body, a diffstat, the diff): `git am`-able, and
# scripts/build_runtime.sh applies them with `patch -p1`. Notes and dates travel with the commits (`git am` keeps
# the Date header), so an unchanged series exports byte for byte.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SERIES="$ROOT/patches/llama.cpp"
NAME="ggufbridge"
EMAIL="ggufbridge@users.noreply.github.com"
# a patch without a Date header (written by hand) gets this one, so that its export is reproducible
FIXED_DATE="Tue, 1 Dec 2026 00:00:00 +0000"

die() { echo "patches: $*" >&2; exit 2; }
g() { git -C "$1" -c user.name="$NAME" -c user.email="$EMAIL" -c core.autocrlf=false -c commit.gpgsign=false "${@:2}"; }

apply() {  # apply SERIES_DIR DIR
  local from="$1" dir="$2" src p
  src=$(bash "$ROOT/scripts/build_runtime.sh" --source-only)
  rm -rf "$dir"
  mkdir -p "$(dirname "$dir")"
  cp -r "$src" "$dir"
  rm -rf "$dir/.git"  # the sdist's submodule pointer
  g "$dir" init -q
  g "$dir" add -A -f
  GIT_AUTHOR_DATE="$FIXED_DATE" GIT_COMMITTER_DATE="$FIXED_DATE" \
    g "$dir" commit -q -m "llama.cpp as vendored in llama-cpp-python (pinned tree)"
  g "$dir" tag pinned
  g "$dir" config notes.rewriteRef refs/notes/commits  # a rebased or amended commit keeps its file name
  while IFS= read -r p; do
    # git am takes the author date from the Date header (now, where there is none)
    awk -v d="$FIXED_DATE" 'NR == 1 && /^From: / && !seen { print "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001" }
      /^Subject: / && !dated && !seen { print "Date: " d } /^Date: / { dated = 1 } /^$/ { seen = 1 } { print }' "$p" \
      | GIT_COMMITTER_DATE="$FIXED_DATE" g "$dir" am -q --keep-cr \
      || { g "$dir" am --abort 2>/dev/null || true; die "$(basename "$p") does not apply on top of the ones before it"; }
    g "$dir" notes add -m "$(basename "$p")" HEAD
  done < <(find "$from" -maxdepth 1 -name '[0-9][0-9][0-9][0-9]-*.patch' | sort)
  echo "patches: $(g "$dir" rev-list --count pinned..HEAD) commits over the pinned tree in $dir" >&2
}

export_series() {  # export DIR SERIES_DIR
  local dir="$1" to="$2" tmp n=0 c name
  g "$dir" rev-parse -q --verify pinned >/dev/null || die "$dir has no 'pinned' tag: make it with 'scripts/patches.sh apply'"
  [ -z "$(g "$dir" status --porcelain --untracked-files=no)" ] || die "$dir has uncommitted changes: commit or stash them first"
  tmp=$(mktemp -d)
  for c in $(g "$dir" rev-list --reverse pinned..HEAD); do
    n=$((n + 1))
    name=$(g "$dir" notes show "$c" 2>/dev/null | head -1 || true)
    if [ -n "$name" ]; then
      name="${name#[0-9][0-9][0-9][0-9]-}"
    else
      name=$(basename "$(g "$dir" format-patch -1 "$c" -o "$tmp/.n")")
      name="${name#[0-9][0-9][0-9][0-9]-}"
    fi
    g "$dir" format-patch -1 --stdout --zero-commit --no-signature -N --stat=100 "$c" >"$tmp/$(printf %04d "$n")-$name"
  done
  rm -rf "$tmp/.n"
  [ "$n" -gt 0 ] || { rm -rf "$tmp"; die "no commits after 'pinned' in $dir"; }
  mkdir -p "$to"
  find "$to" -maxdepth 1 -name '[0-9][0-9][0-9][0-9]-*.patch' -delete
  mv "$tmp"/*.patch "$to"/
  rm -rf "$tmp"
  echo "patches: wrote $n patches to $to" >&2
}

cmd="${1:-}"
dir="${2:-$ROOT/.dev/llama.cpp-series}"
case "$cmd" in
  apply) apply "$SERIES" "$dir" ;;
  export) export_series "$dir" "$SERIES" ;;
  check)
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    apply "$SERIES" "$work/tree"
    export_series "$work/tree" "$work/out"
    diff -r "$SERIES" "$work/out" >&2 || die "the series does not come back unchanged from its commits"
    echo "patches: the series round-trips through git am / format-patch" >&2 ;;
  *) sed -n 2,18p "$0"; [ -z "$cmd" ] || [ "$cmd" = -h ] || [ "$cmd" = --help ] || exit 2 ;;
esac
