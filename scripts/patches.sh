#!/usr/bin/env bash
# The patch series (ggufbridge/runtime/native/{llama.cpp,llama.cpp-perf}/NNNN-name.patch: the core part, then the
# performance part; docs/patches.md) as git commits over the pristine pinned tree, and back.
# Edit the series in the git copy, never the .patch files by hand:
#
#   scripts/patches.sh apply  [DIR] [--core]  a git copy of the pinned tree in DIR with one commit per patch, the core
#                                     part then the performance part (--core: the core part only), each in name
#                                     order (tag `pinned` = the pristine tree; each commit's note = PART/FILE name)
#   scripts/patches.sh export [DIR]   write DIR's commits since `pinned` back to the parts their notes name
#   scripts/patches.sh check          apply + export into a scratch folder: the series must come back unchanged
#   scripts/patches.sh standalone TREE   per patch: does it apply alone to the llama.cpp tree TREE, and in order
#                                     (each part on top of what applied before it): a rebase's first map
#
# DIR defaults to .dev/llama.cpp-series. A patch keeps its number for good (other docs cite "patch 0013"), so a part
# may skip numbers. In DIR: fix a patch with `git commit --fixup=<its commit>` and `git rebase -i --autosquash
# pinned`; add one with a commit whose message is "<subsystem>: what" plus a why-body and name its file with
# `git notes add -m llama.cpp/NNNN-short-name.patch` (the next free number; llama.cpp-perf/ for a performance
# patch, which needs its GPU A/B in docs/benchmarks.md); a commit without a note goes to the core part under the
# next free number and format-patch's slug of its subject. A new core patch must apply before the performance part:
# keep it before the first perf commit (`git rebase -i pinned`).
# The files are format-patch output (From/Date/Subject, the body, a diffstat, the diff): `git am`-able, and
# build_runtime.sh applies them with `patch -p1`. Notes and dates travel with the commits (`git am` keeps the Date
# header), so an unchanged series exports byte for byte.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
NATIVE="$ROOT/ggufbridge/runtime/native"
PARTS=(llama.cpp llama.cpp-perf)  # application order
NAME="ggufbridge"
EMAIL="ggufbridge@users.noreply.github.com"
# a patch without a Date header (written by hand) gets this one, so that its export is reproducible
FIXED_DATE="Tue, 1 Dec 2026 00:00:00 +0000"

die() { echo "patches: $*" >&2; exit 2; }
g() { git -C "$1" -c user.name="$NAME" -c user.email="$EMAIL" -c core.autocrlf=false -c commit.gpgsign=false "${@:2}"; }

part_files() {  # part_files SERIES_ROOT PART: the part's patches in application order
  [ -d "$1/$2" ] && find "$1/$2" -maxdepth 1 -name '[0-9][0-9][0-9][0-9]-*.patch' | sort
  return 0
}

apply() {  # apply SERIES_ROOT DIR PART...
  local from="$1" dir="$2" src p part
  shift 2
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
  g "$dir" config ggufbridge.parts "$*"  # what export writes back (an apply --core leaves the perf part alone)
  for part in "$@"; do
    while IFS= read -r p; do
      # git am takes the author date from the Date header (now, where there is none)
      awk -v d="$FIXED_DATE" 'NR == 1 && /^From: / && !seen { print "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001" }
        /^Subject: / && !dated && !seen { print "Date: " d } /^Date: / { dated = 1 } /^$/ { seen = 1 } { print }' "$p" \
        | GIT_COMMITTER_DATE="$FIXED_DATE" g "$dir" am -q --keep-cr \
        || { g "$dir" am --abort 2>/dev/null || true; die "$part/$(basename "$p") does not apply on top of the ones before it"; }
      g "$dir" notes add -m "$part/$(basename "$p")" HEAD
    done < <(part_files "$from" "$part")
  done
  echo "patches: $(g "$dir" rev-list --count pinned..HEAD) commits over the pinned tree in $dir ($*)" >&2
}

export_series() {  # export DIR SERIES_ROOT
  local dir="$1" to="$2" tmp n=0 c name part parts next
  g "$dir" rev-parse -q --verify pinned >/dev/null || die "$dir has no 'pinned' tag: make it with 'scripts/patches.sh apply'"
  [ -z "$(g "$dir" status --porcelain --untracked-files=no)" ] || die "$dir has uncommitted changes: commit or stash them first"
  parts=$(g "$dir" config ggufbridge.parts || echo "${PARTS[*]}")
  tmp=$(mktemp -d)
  # the next free number: one above every number the notes and the series' files use
  next=$( { g "$dir" log --format=%N pinned..HEAD | sed -n 's|^[^/]*/\([0-9][0-9][0-9][0-9]\)-.*|\1|p'
            for part in "${PARTS[@]}"; do part_files "$to" "$part" | sed 's|.*/\([0-9][0-9][0-9][0-9]\)-.*|\1|'; done
          } | sort -n | tail -1)
  next=$((10#${next:-0} + 1))
  for c in $(g "$dir" rev-list --reverse pinned..HEAD); do
    n=$((n + 1))
    name=$(g "$dir" notes show "$c" 2>/dev/null | head -1 || true)
    case "$name" in
      */[0-9][0-9][0-9][0-9]-*.patch) part=${name%%/*}; name=${name#*/} ;;
      *) part=${PARTS[0]}
         name=$(basename "$(g "$dir" format-patch -1 "$c" -o "$tmp/.n")")
         name="$(printf %04d "$next")-${name#[0-9][0-9][0-9][0-9]-}"; next=$((next + 1)) ;;
    esac
    case " ${PARTS[*]} " in *" $part "*) ;; *) die "commit $c: its note names part '$part', not one of ${PARTS[*]}" ;; esac
    mkdir -p "$tmp/$part"
    g "$dir" format-patch -1 --stdout --zero-commit --no-signature -N --stat=100 "$c" >"$tmp/$part/$name"
  done
  rm -rf "$tmp/.n"
  [ "$n" -gt 0 ] || { rm -rf "$tmp"; die "no commits after 'pinned' in $dir"; }
  for part in $parts; do
    mkdir -p "$to/$part"
    find "$to/$part" -maxdepth 1 -name '[0-9][0-9][0-9][0-9]-*.patch' -delete
    [ -d "$tmp/$part" ] && mv "$tmp/$part"/*.patch "$to/$part"/
  done
  rm -rf "$tmp"
  echo "patches: wrote $n patches to $to ($parts)" >&2
}

standalone() {  # standalone TREE: per patch, applies alone to TREE? and in order (core, then perf)?
  local tree="$1" work p part alone inorder ok=0 all=0
  [ -d "$tree/src" ] && [ -d "$tree/ggml" ] || die "$tree is not a llama.cpp tree (no src/, ggml/)"
  work=$(mktemp -d)
  cp -r "$tree" "$work/tree"
  printf '%-62s %-11s %s\n' "patch" "standalone" "in order"
  for part in "${PARTS[@]}"; do
    while IFS= read -r p; do
      all=$((all + 1))
      if patch -p1 --dry-run --forward --batch -d "$tree" <"$p" >"$work/log" 2>&1; then
        alone=yes; grep -q "with fuzz" "$work/log" && alone="yes(fuzz)"
      else alone=no; fi
      if patch -p1 --dry-run --forward --batch -d "$work/tree" <"$p" >"$work/log" 2>&1; then
        patch -p1 --forward --batch --quiet -d "$work/tree" <"$p" >/dev/null 2>&1
        inorder=yes; grep -q "with fuzz" "$work/log" && inorder="yes(fuzz)"; ok=$((ok + 1))
      else
        inorder="no: $(grep -m1 -o 'FAILED.*\|can.t find file.*\|Reversed.*' "$work/log" || echo failed)"
      fi
      printf '%-62s %-11s %s\n' "$part/$(basename "$p")" "$alone" "$inorder"
    done < <(part_files "$NATIVE" "$part")
  done
  rm -rf "$work"
  echo "patches: $ok of $all apply in order to $tree" >&2
}

cmd="${1:-}"
dir="${2:-$ROOT/.dev/llama.cpp-series}"
case "$cmd" in
  apply)
    if [ "${3:-${2:-}}" = --core ]; then [ "${2:-}" = --core ] && dir="$ROOT/.dev/llama.cpp-series"; apply "$NATIVE" "$dir" "${PARTS[0]}"
    else apply "$NATIVE" "$dir" "${PARTS[@]}"; fi ;;
  export) export_series "$dir" "$NATIVE" ;;
  check)
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    apply "$NATIVE" "$work/tree" "${PARTS[@]}"
    export_series "$work/tree" "$work/out"
    bad=""
    for part in "${PARTS[@]}"; do
      [ "$(cd "$NATIVE/$part" && ls [0-9]*.patch)" = "$(cd "$work/out/$part" && ls [0-9]*.patch)" ] || bad="$bad $part/(file names)"
      for f in "$NATIVE/$part"/[0-9]*.patch; do
        cmp -s "$f" "$work/out/$part/$(basename "$f")" || bad="$bad $part/$(basename "$f")"
      done
    done
    [ -z "$bad" ] || die "the series does not come back unchanged from its commits:$bad"
    echo "patches: the series round-trips through git am / format-patch" >&2 ;;
  standalone) standalone "${2:?usage: scripts/patches.sh standalone LLAMA_CPP_TREE}" ;;
  *) sed -n 2,24p "$0"; [ -z "$cmd" ] || [ "$cmd" = -h ] || [ "$cmd" = --help ] || exit 2 ;;
esac
