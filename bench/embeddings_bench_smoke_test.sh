#!/usr/bin/env bash
# `bench/run.sh embeddings`, tiny (4,000 lines, 50 ids per field), through
# every line: pstrain async on 2 real shards and 2 workers, hybrid (figures
# or "not supported yet"), the PyTorch peers (bench/torch_dlrm.py) in one
# process and DDP on 2 ranks, and the scale line; its last line must be the
# JSON with every figure and ratio. No speed or AUC target is asserted here
# (bench/README.md has the figures); only that each line ran and learned
# something (AUC above chance on the planted data).
set -euo pipefail
export TMPDIR=${TEST_TMPDIR:-/tmp}
export PSTRAIN_BIN=$PWD  # the runfiles tree has Bazel's layout
out=$(EMB_TRAIN=4000 EMB_TEST=1000 EMB_IDS=50 EMB_CAP_MB=3 EMB_SCALE=10 bench/run.sh embeddings 1 | tail -1)
/usr/bin/python3 -c '
import json, sys
r = json.loads(sys.argv[1])
assert r["bench"] == "embeddings", r
for line in (r["pstrain_async"], r["scale"]["pstrain_async"], r["pstrain_async_replicas_1"]):
    assert line["samples_per_s"] > 0 and line["worker_rss_mb"] > 0 and line["shard_rss_mb"] > 0, line
    assert line["rows_held"] > 0 and line["evicted"] >= 0, line
    assert 0.55 < line["auc"] < 1, line
for line in (r["torch_one_process"], r["torch_ddp_gloo_2"]):
    assert line["samples_per_s"] > 0 and 0.55 < line["auc"] < 1, line
assert r["pstrain_hybrid"] == "not supported yet" or r["pstrain_hybrid"]["samples_per_s"] > 0, r
assert 0.5 < r["bayes_auc"] < 1 and r["scale"]["ids_per_field"] == 500, r
assert r["scale"]["torch_full_table_bytes_per_process"] == 26 * 500 * 16 * 4 * 2, r  # rows x dim x 4 B x (1 + Adagrad)
for k in ("vs_torch_ddp", "vs_torch_single", "worker_rss_growth", "auc_gap_to_bayes", "replicas_vs_none"):
    assert k in r["ratios"], k
assert r["ratios"]["vs_torch_ddp"] > 0 and r["ratios"]["worker_rss_growth"] > 0, r
# Each shard backs up the rows of the other: about twice the rows held.
assert r["pstrain_async_replicas_1"]["rows_held"] > 1.5 * r["pstrain_async"]["rows_held"], r
print("ok:", json.dumps(r["ratios"]))
' "$out"
# bench/planted_ceiling.py on planted data of the same size: the planted
# form fit to convergence learns something, and no more than the truth.
d=$(mktemp -d)
worker/criteo_gen --id_space 50 --train_examples 4000 --test_examples 1000 --out_train "$d/train.tsv" \
  --out_test "$d/test.tsv" --out_meta "$d/meta.txt" >/dev/null
ceiling=$(/usr/bin/python3 bench/planted_ceiling.py "$d/train.tsv" "$d/test.tsv" 1e-3 | tail -1)
/usr/bin/python3 -c '
import json, sys
r = json.loads(sys.argv[1])
bayes = float(dict(l.split() for l in open(sys.argv[2]) if not l.startswith("#"))["bayes_auc"])
assert r["bench"] == "planted_ceiling" and 0.55 < r["test_auc"] < bayes + 0.01, (r, bayes)
print("ok: planted ceiling", r["test_auc"], "bayes", bayes)
' "$ceiling" "$d/meta.txt"
