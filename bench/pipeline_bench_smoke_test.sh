#!/usr/bin/env bash
# `bench/run.sh pipeline`, tiny (batch 64, 3 steps), through every line:
# pstrain unpipelined and in 2 and 4 stages with both schedules (real
# worker processes over Gloo), PyTorch's Pipe and the plain model; its last
# line must be the JSON with every figure and ratio. No speed or bubble
# target is asserted here (bench/README.md has the figures); only that each
# line ran and measured something.
set -euo pipefail
export TMPDIR=${TEST_TMPDIR:-/tmp}
export PSTRAIN_BIN=$PWD  # the runfiles tree has Bazel's layout
out=$(PIPE_BATCH=64 PIPE_STEPS=3 bench/run.sh pipeline 1 | tail -1)
/usr/bin/python3 -c '
import json, sys
r = json.loads(sys.argv[1])
assert r["bench"] == "pipeline", r
for k, stages in (("plain", 1), ("gpipe2", 2), ("1f1b2", 2), ("gpipe4", 4), ("1f1b4", 4)):
    line = r["pstrain"][k]
    assert line["samples_per_s"] > 0, line
    assert len(line["bubble_per_stage"]) == stages and len(line["peak_rss_mb_per_stage"]) == stages, line
    assert all(0 <= b < 1 for b in line["bubble_per_stage"]) and min(line["peak_rss_mb_per_stage"]) > 0, line
    if stages > 1:  # what the schedules hold: GPipe all M = 4P micro-batches, 1F1B at most P - s
        want = [4 * stages] * stages if k.startswith("gpipe") else [stages - s for s in range(stages)]
        assert line["held_micro_batches_per_stage"] == want, line
for k in ("torch_plain", "torch2", "torch4"):
    assert r["torch"][k]["samples_per_s"] > 0, r["torch"]
for k in ("vs_torch_pipe_p2", "vs_torch_pipe_p4", "bubble_vs_theory_1f1b_p2", "rss_1f1b_vs_gpipe_p4_stage0"):
    assert r["ratios"][k] > 0, k
print("ok:", json.dumps(r["ratios"]))
' "$out"
