#!/usr/bin/env bash
# `bench/run.sh gpu` measures on GPU machines only, where a script broken by
# a change made elsewhere costs a lent machine's scarce minutes. Here it
# runs on the CPU (GPU_DEVICE=cpu), tiny, through every line and the
# settings the GPU sweep varies, and must print its figures: samples/s of
# each line asked for, 0 for each left out, the workers' account of a step.
# No speed is asserted (bench/README has the figures).
set -euo pipefail
export TMPDIR=${TEST_TMPDIR:-/tmp}
export PSTRAIN_BIN=$PWD  # the runfiles tree has Bazel's layout
tiny=(GPU_DEVICE=cpu GPU_THREADS=1 GPU_BATCH=2 GPU_STEPS=25)

check() {  # check JSON PYTHON-ASSERTIONS
  /usr/bin/python3 -c '
import json, sys
r = json.loads(sys.argv[1])
s, h = r["samples_per_s"], r["host_ms_per_step"]
'"$2"'
print("ok:", json.dumps(r["samples_per_s"]), json.dumps(r["host_ms_per_step"]))
' "$1"
}

out=$(env "${tiny[@]}" bench/run.sh gpu 1 | tail -1)
check "$out" '
assert r["bench"] == "gpu" and r["device"] == "cpu", r
for k in ("pstrain_ps_2_workers", "pstrain_allreduce_gloo_1", "torch_one_process", "torch_ddp_gloo_1"):
    assert s[k] > 0, (k, s)
for line in ("ps", "allreduce"):
    assert h[line]["step"] > 0 and 0 <= h[line]["exchange_wait"] < h[line]["step"], (line, h)
assert r["ratios"]["allreduce_vs_torch_ddp"] > 0 and r["ratios"]["ps_vs_torch_one_process"] > 0, r'

# The sweep's other settings, and bf16 autocast on both sides.
out=$(env "${tiny[@]}" GPU_LINES="ps torch" GPU_WIRE=bf16 GPU_SHARDS=4 GPU_REQUESTS_IN_FLIGHT=0 GPU_PRECISION=bf16 \
  bench/run.sh gpu 1 | tail -1)
check "$out" '
assert r["wire_dtype"] == "bf16" and r["ps_shards"] == 4 and r["ps_requests_in_flight"] == 0, r
assert r["precision"] == "bf16", r
assert s["pstrain_ps_2_workers"] > 0 and s["torch_one_process"] > 0, s
assert s["pstrain_allreduce_gloo_1"] == 0 and s["torch_ddp_gloo_1"] == 0, s
assert r["ratios"]["allreduce_vs_torch_ddp"] == 0 and r["ratios"]["ps_vs_torch_one_process"] > 0, r'
