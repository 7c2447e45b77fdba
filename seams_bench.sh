#!/usr/bin/env bash
# seams, part A (issue 38 item 4): the bench leaves the runtime package for its own
# distribution, benchmarks/ (package ctxwarden_bench). Re-runnable and idempotent: run it from
# a checkout's root (or give the root) after merging a branch that still adds or edits files
# under src/ctxwarden/bench/ or imports ctxwarden.bench; it moves what is left there and
# rewrites the imports. Hand fixes (tune/measures.py, cli/bench.py's install hint, the sample
# data, pyproject) are in the commit, not here.
set -euo pipefail
cd "${1:-.}"
OLD=src/ctxwarden/bench
NEW=benchmarks/src/ctxwarden_bench
mkdir -p "$(dirname "$NEW")"
if [ -d "$OLD" ]; then
  if [ ! -d "$NEW" ]; then
    git mv "$OLD" "$NEW"
  else  # a merged branch added files under the old path: move them one by one
    git ls-files "$OLD" | while read -r f; do
      dest="$NEW/${f#"$OLD"/}"
      mkdir -p "$(dirname "$dest")"
      if [ -e "$dest" ] && ! git diff --quiet --no-index "$f" "$dest" 2>/dev/null; then
        echo "CONFLICT: $f and $dest both exist and differ; merge by hand" >&2
      else
        git mv -f "$f" "$dest"
      fi
    done
  fi
  find "$OLD" -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true
  rmdir -p "$OLD"/* "$OLD" 2>/dev/null || true
fi
# imports and dotted names, paths in docs and comments
files=$(git ls-files -- src tests docs benchmarks README.md mkdocs.yml .ci pyproject.toml deploy \
  | grep -E '\.(py|md|toml|yml|yaml|cfg|txt|sh)$|^\.ci/' || true)
[ -n "$files" ] && echo "$files" | xargs sed -i -E \
  -e 's/\bctxwarden\.bench\b/ctxwarden_bench/g' \
  -e 's#src/ctxwarden/bench/#benchmarks/src/ctxwarden_bench/#g' \
  -e 's/^from ctxwarden import bench$/import ctxwarden_bench as bench/'
echo "seams_bench: done"
