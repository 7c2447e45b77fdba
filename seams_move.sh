#!/usr/bin/env bash
# seams, part B (issue 38, items 1 and 5): a core package, the pipeline package named
# `pipeline` (not `build`), one module per repeated name. Re-runnable and idempotent: run it
# from a checkout's root (or give the root) after merging a branch written against the old
# layout; it moves whatever is still (or again) at an old path and rewrites imports, dotted
# names and paths over src, tests, docs, benchmarks, README, mkdocs.yml, .ci and pyproject.
# A file that exists at both ends and differs is reported as CONFLICT and left for a hand merge.
# Hand fixes that are not mechanical are in their own commit (see the report of h/seams).
set -euo pipefail
cd "${1:-.}"
P=src/ctxwarden

mvpath() {  # mvpath OLD NEW: a file or a folder, merged file by file into what is there
  local old=$1 new=$2
  [ -e "$old" ] || return 0
  if [ -f "$old" ]; then
    mkdir -p "$(dirname "$new")"
    if [ -e "$new" ]; then
      if cmp -s "$old" "$new"; then git rm -q -f "$old"; else echo "CONFLICT: $old and $new both exist and differ" >&2; fi
    else
      git mv "$old" "$new"
    fi
    return 0
  fi
  if [ ! -e "$new" ]; then
    mkdir -p "$(dirname "$new")"
    git mv "$old" "$new"
  else
    git ls-files "$old" | while read -r f; do mvpath "$f" "$new/${f#"$old"/}"; done
  fi
  find "$old" -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true
  find "$old" -depth -type d -empty -delete 2>/dev/null || true
}

# -- the core: what every package imports and that imports none of them
mkdir -p $P/core
if [ ! -e $P/core/__init__.py ]; then
  cat > $P/core/__init__.py <<'PY'
"""The foundation every other package imports and that imports none of them: messages and
their kinds, tool-call pairing, message handles, timestamps, errors, the bounded cache
helper, token counting and the model registry. The layer contracts in ``pyproject.toml``
(``[tool.importlinter]``, run by CI) keep it so."""
PY
  git add $P/core/__init__.py
fi
mvpath $P/messages.py        $P/core/messages.py
mvpath $P/kinds.py           $P/core/kinds.py
mvpath $P/errors.py          $P/core/errors.py
mvpath $P/caching.py         $P/core/caching.py
mvpath $P/build/pairing.py   $P/core/pairing.py
mvpath $P/steps/handles.py   $P/core/handles.py
mvpath $P/formats/checks.py  $P/core/checks.py
mvpath $P/tokens             $P/core/tokens
mvpath $P/registry           $P/core/registry
# -- the steps' state (the memos the steps read) sits with the steps, below the engine
mvpath $P/build/state.py     $P/steps/state.py
# -- the pipeline package: not `build/`, which tools and people take for build output
mvpath $P/build/pipeline.py  $P/build/cascade.py
mvpath $P/memory/cycle.py    $P/build/summarize.py     # the summary cycle runs models: above memory
mvpath $P/build              $P/pipeline
# -- one module per name
mvpath $P/memory/recall.py   $P/session/recall.py      # recall by handle (a session's store too)
mvpath $P/steps/recall.py    $P/steps/recall_relevant.py
mvpath $P/steps/pairing.py   $P/steps/keep_pairs.py
mvpath $P/session/state.py   $P/session/rows.py
mvpath $P/service/pipeline.py  $P/service/proxied_call.py
mvpath $P/service/summaries.py $P/service/summary_runs.py
mvpath $P/mcp/http.py        $P/service/mcp_http.py    # the /mcp route is the service's

# -- dotted names and paths (every target is no source, so a second run is a no-op). perl, not
#    sed: `ctxwarden.build` alone, and `ctxwarden.build.<not a module>`, are the span's name and
#    attributes (telemetry) and stay; only the package's modules are renamed.
files=$(git ls-files -- src tests docs benchmarks README.md mkdocs.yml .ci pyproject.toml deploy \
  | grep -E '\.(py|md|toml|yml|yaml|cfg|txt|sh|html|j2|ini)$|^\.ci/' || true)
mods=$(find $P/pipeline -mindepth 1 -maxdepth 1 \( -name '*.py' -o -type d \) ! -name '__*' \
  -printf '%f\n' 2>/dev/null | sed 's/\.py$//' | sort -u | paste -sd'|' - || true)
export SEAMS_MODS="$mods"
[ -n "$files" ] && echo "$files" | xargs perl -pi -e '
  BEGIN { $m = $ENV{SEAMS_MODS} }
  s/\bctxwarden\.build\.pairing\b/ctxwarden.core.pairing/g;
  s/\bctxwarden\.build\.pipeline\b/ctxwarden.pipeline.cascade/g;
  s/\bctxwarden\.build\.state\b/ctxwarden.steps.state/g;
  s/\bctxwarden\.memory\.cycle\b/ctxwarden.pipeline.summarize/g;
  s/\bctxwarden\.build\.($m)\b/ctxwarden.pipeline.$1/g;
  s/\bfrom ctxwarden\.build import\b/from ctxwarden.pipeline import/g;
  s/\bimport ctxwarden\.build\b(?!\.)/import ctxwarden.pipeline/g;
  s{\bctxwarden/build/pairing\.py}{ctxwarden/core/pairing.py}g;
  s{\bctxwarden/build/pipeline\.py}{ctxwarden/pipeline/cascade.py}g;
  s{\bctxwarden/build/state\.py}{ctxwarden/steps/state.py}g;
  s{\bctxwarden/memory/cycle\.py}{ctxwarden/pipeline/summarize.py}g;
  s{\bctxwarden/build/}{ctxwarden/pipeline/}g;
  s/\bctxwarden\.memory\.recall\b/ctxwarden.session.recall/g;
  s/\bctxwarden\.steps\.handles\b/ctxwarden.core.handles/g;
  s/\bctxwarden\.steps\.pairing\b/ctxwarden.steps.keep_pairs/g;
  s/\bctxwarden\.steps\.recall\b/ctxwarden.steps.recall_relevant/g;
  s/\bctxwarden\.session\.state\b/ctxwarden.session.rows/g;
  s/\bctxwarden\.service\.pipeline\b/ctxwarden.service.proxied_call/g;
  s/\bctxwarden\.service\.summaries\b/ctxwarden.service.summary_runs/g;
  s/\bctxwarden\.mcp\.http\b/ctxwarden.service.mcp_http/g;
  s/\bctxwarden\.formats\.checks\b/ctxwarden.core.checks/g;
  s{\bctxwarden/memory/recall\.py}{ctxwarden/session/recall.py}g;
  s{\bctxwarden/steps/handles\.py}{ctxwarden/core/handles.py}g;
  s{\bctxwarden/steps/pairing\.py}{ctxwarden/steps/keep_pairs.py}g;
  s{\bctxwarden/steps/recall\.py}{ctxwarden/steps/recall_relevant.py}g;
  s{\bctxwarden/session/state\.py}{ctxwarden/session/rows.py}g;
  s{\bctxwarden/service/pipeline\.py}{ctxwarden/service/proxied_call.py}g;
  s{\bctxwarden/service/summaries\.py}{ctxwarden/service/summary_runs.py}g;
  s{\bctxwarden/mcp/http\.py}{ctxwarden/service/mcp_http.py}g;
  s{\bctxwarden/formats/checks\.py}{ctxwarden/core/checks.py}g;
  # a moved module imported by name from its package (one name on the line)
  s/\bfrom ctxwarden\.session import state\b/from ctxwarden.session import rows/g;
  s/\bfrom ctxwarden\.memory import recall\b/from ctxwarden.session import recall/g;
  s/\bfrom ctxwarden\.memory import cycle\b/from ctxwarden.pipeline import summarize/g;
  s/\bfrom ctxwarden\.steps import handles\b/from ctxwarden.core import handles/g;
  s/\bfrom ctxwarden\.steps import pairing\b/from ctxwarden.steps import keep_pairs/g;
  s/\bfrom ctxwarden\.steps import recall\b/from ctxwarden.steps import recall_relevant/g;
  s/\bfrom ctxwarden\.(?:build|pipeline) import pairing\b/from ctxwarden.core import pairing/g;
  s/\bfrom ctxwarden\.(?:build|pipeline) import state\b/from ctxwarden.steps import state/g;
  s/\bfrom ctxwarden\.(?:build|pipeline) import pipeline\b/from ctxwarden.pipeline import cascade/g;
  s/\bfrom ctxwarden\.service import pipeline\b/from ctxwarden.service import proxied_call/g;
  s/\bfrom ctxwarden\.service import summaries\b/from ctxwarden.service import summary_runs/g;
  s/\bfrom ctxwarden\.mcp import http\b/from ctxwarden.service import mcp_http/g;
  s/\bfrom ctxwarden\.formats import checks\b/from ctxwarden.core import checks/g;
  s/\bfrom ctxwarden import (messages|kinds|errors|caching|tokens|registry)(\s*(?:as \w+)?\s*)$/from ctxwarden.core import $1$2/g;
  for my $c (qw(messages kinds errors caching tokens registry)) {
    s/\bctxwarden\.$c\b/ctxwarden.core.$c/g;
    s{\bctxwarden/$c(\.py|/)}{ctxwarden/core/$c$1}g;
  }
'

# -- the store's build_context (a logged build's stored context) is logged_context, so the one
#    build_context is the engine's
python3 - <<'PY'
import ast, re
from pathlib import Path
roots = [Path("src"), Path("tests"), Path("benchmarks")]
STORE = {"ctxwarden.store.service_tables", "ctxwarden.store.logged_build"}
for root in roots:
    for p in root.rglob("*.py"):
        text = p.read_text(encoding="utf-8")
        if "build_context" not in text:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        from_store = other = False
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if a.name == "build_context":
                        if node.module in STORE:
                            from_store = from_store or a.asname in (None, "build_context")
                        elif a.asname in (None, "build_context"):
                            other = True  # the bare name is the engine's here
        is_def = p.as_posix().endswith("ctxwarden/store/logged_build.py")
        new = text
        new = re.sub(r"\bbuild_context as logged_context\b", "logged_context", new)
        if is_def or (from_store and not other):
            new = re.sub(r"(?<![\w.])build_context\b", "logged_context", new)
            # the engine's, imported under another name, keeps its name
            new = re.sub(r"(from ctxwarden(?:\.pipeline(?:\.engine)?)? import )logged_context as ",
                         r"\1build_context as ", new)
        new = re.sub(r"ctxwarden\.store\.(service_tables|logged_build)\.build_context\b",
                     r"ctxwarden.store.\1.logged_context", new)
        if new != text:
            p.write_text(new, encoding="utf-8")
PY
# -- imports re-sorted and lines re-wrapped where a longer name moved them (ruff, when on PATH)
if command -v ruff >/dev/null 2>&1; then
  dirs=$(ls -d src tests benchmarks/src 2>/dev/null | tr '\n' ' ')
  ruff check -q --fix --select I $dirs || true
  ruff format -q $dirs || true
fi
echo "seams_move: done"
