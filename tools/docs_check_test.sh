#!/bin/bash
# //tools:docs_check_test: the README's rules, checked (tools/check_docs.py).
# The links may point at any file of the tree and the size rule covers every
# .cc/.h file, in every Bazel package, which one BUILD file cannot glob; so
# the check reads the source tree the runfiles link to (the target is
# tagged "external": never cached, it always reads today's tree).
set -euo pipefail
readme="$(readlink -f README.md)"
root="$(dirname "$readme")"
if [[ ! -f "$root/tools/check_docs.py" || ! -f "$root/WORKSPACE" ]]; then
  echo "cannot find the source tree from the runfiles' README.md ($readme)" >&2
  exit 1
fi
# Debian's python3: the first python3 on PATH may be another interpreter.
exec /usr/bin/python3 "$root/tools/check_docs.py" "$root"
