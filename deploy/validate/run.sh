#!/usr/bin/env bash
# Renders every overlay, validates each object offline against the official
# Kubernetes schemas and types (kubernetes-models), proves the validator
# catches a wrong type and a misspelled field, and checks the manifests
# against the binaries' flags. Needs kubectl, node and `npm ci` here (make
# setup), and the built binaries (bazel-bin).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for overlay in cpu gpu; do
  kubectl kustomize "deploy/k8s/overlays/$overlay" >"$out/$overlay.yaml" 2>"$out/$overlay.err" \
    || { cat "$out/$overlay.err" >&2; exit 1; }
  echo "rendered $overlay: $(grep -c '^kind:' "$out/$overlay.yaml") objects"
done
node deploy/validate/validate.mjs "$out/cpu.yaml" "$out/gpu.yaml" deploy/k8s/examples/pytorchjob.yaml deploy/k8s/examples/cert-manager.yaml deploy/k8s/examples/auth-secret.yaml
for bad in deploy/validate/testdata/*.yaml; do
  if node deploy/validate/validate.mjs "$bad" >"$out/bad.log" 2>&1; then
    echo "the validator accepted $bad, which is invalid" >&2
    exit 1
  fi
  echo "refused as it should be: $bad ($(grep -m1 -o 'TS[0-9]*: .*\|must .*' "$out/bad.log" | head -1 | cut -c1-100))"
done
node deploy/validate/check_flags.mjs bazel-bin "$out/cpu.yaml" "$out/gpu.yaml"
echo "k8s manifests: valid"
