#!/usr/bin/env bash
# Runs the Bazel suite under every ATEN_CPU_CAPABILITY LibTorch may pick on
# an x86-64 CPU: default (no vector extensions), avx2, and avx512 where this
# CPU has it (LibTorch falls back to avx2 otherwise, which would only repeat
# that run). Child processes (shards, workers) inherit the setting. Exits
# non-zero if any run failed; prints one line per capability at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
BAZEL=${BAZEL:-bazel}
caps=(default avx2)
# LibTorch's avx512 kernels need AVX512F, BW, VL and DQ.
if grep -q avx512f /proc/cpuinfo && grep -q avx512bw /proc/cpuinfo && grep -q avx512vl /proc/cpuinfo &&
  grep -q avx512dq /proc/cpuinfo; then
  caps+=(avx512)
else
  echo "test-cpus: this CPU has no AVX-512: the avx512 run is left out"
fi
summary=()
status=0
for cap in "${caps[@]}"; do
  echo "=== ATEN_CPU_CAPABILITY=${cap}"
  if "${BAZEL}" test //... --test_env=ATEN_CPU_CAPABILITY="${cap}" "$@"; then
    summary+=("${cap}: passed")
  else
    summary+=("${cap}: FAILED")
    status=1
  fi
done
printf 'test-cpus: %s\n' "${summary[@]}"
exit "${status}"
