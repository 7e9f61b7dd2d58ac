#!/bin/bash
# The layering rule of docs/design.md, checked instead of claimed:
# dependencies point down only (shells over transport over cores), and the
# servers and the worker never depend on each other. Each query must come
# back empty; `make test` runs this after the Bazel suite.
set -u
cd "$(dirname "$0")/.."
BAZEL=${BAZEL:-bazel}

rules=(
  "deps(//worker/...) intersect //server/..."
  "deps(//server/ps/...) intersect (//worker/... + //server/coordinator/...)"
  "deps(//server/coordinator/...) intersect (//worker/... + //server/ps/...)"
  "deps(//rpc/...) intersect (//server/... + //worker/... + //client/...)"
  "deps(//collective/...) intersect (//rpc/... + //server/... + //worker/... + //client/...)"
  "deps(//table/...) intersect (//rpc/... + //collective/... + //server/... + //worker/... + //client/...)"
  "deps(//checkpoint/...) intersect (//rpc/... + //collective/... + //server/... + //worker/... + //client/...)"
  "deps(//embedding/...) intersect (//rpc/... + //collective/... + //table/... + //checkpoint/... + //server/... + //worker/... + //client/...)"
  "deps(//pipeline/...) intersect (//rpc/... + //collective/... + //table/... + //embedding/... + //checkpoint/... + //server/... + //worker/... + //client/...)"
  "deps(//quantize/...) intersect (//rpc/... + //collective/... + //table/... + //embedding/... + //checkpoint/... + //server/... + //worker/... + //client/...)"
  "deps(//common/...) intersect (//rpc/... + //collective/... + //table/... + //embedding/... + //checkpoint/... + //server/... + //worker/... + //client/...)"
)

status=0
for rule in "${rules[@]}"; do
  if ! out=$("$BAZEL" query --noshow_progress "$rule" 2>/tmp/check_deps.err); then
    echo "check_deps: the query failed: $rule" >&2
    cat /tmp/check_deps.err >&2
    status=1
  elif [ -n "$out" ]; then
    echo "check_deps: a dependency points the wrong way: $rule" >&2
    echo "$out" | sed 's/^/  /' >&2
    status=1
  fi
done
[ $status -eq 0 ] && echo "check_deps: ${#rules[@]} layering rules hold"
exit $status
