#!/usr/bin/env bash
# A/B of push+pull throughput between two builds of pstrain, alternating
# runs on the same machine (the figures of a shared machine drift; the
# alternation cancels the drift). For checking that a change to the shard
# or the codec costs nothing.
#
#   [AB_WIRE=bf16|fp16] bench/ab_pushpull.sh OLD_BAZEL_BIN NEW_BAZEL_BIN [REPS]
#   e.g. git worktree add /tmp/old HEAD~3 && (cd /tmp/old && bazel build //server/ps:pstrain-ps //bench:pushpull_bench)
#        bench/ab_pushpull.sh /tmp/old/bazel-bin bazel-bin 5
#
# Each run: 2 shards + 2 workers on 127.0.0.1, 10M float32 (flat) or many
# mid-sized tensors (mixed), PushPull every step for 6 s. Prints one line
# per pair and, last, one JSON object with the medians.
set -uo pipefail
old=${1:?usage: bench/ab_pushpull.sh OLD_BAZEL_BIN NEW_BAZEL_BIN [REPS]}
new=${2:?usage: bench/ab_pushpull.sh OLD_BAZEL_BIN NEW_BAZEL_BIN [REPS]}
reps=${3:-5}
PY=/usr/bin/python3
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pstrain-ab.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
wait_file() { local d=$((SECONDS + $2)); until [ -s "$1" ]; do [ $SECONDS -lt $d ] || return 1; sleep 0.05; done; }
# Both sides send a step the same way: as training does where both
# benchmarks know --requests, else one request per shard (what a benchmark
# from before --requests does).
knows_requests() { "$1/bench/pushpull_bench" --helpfull 2>&1 | grep -q -- '-requests'; }
requests_flag() {  # requests_flag BIN
  if knows_requests "$old" && knows_requests "$new"; then echo --requests=training
  elif knows_requests "$1"; then echo --requests=whole
  fi
}
once() {  # once BIN MODEL -> GB/s of both workers together
  local bin=$1 model=$2 run=$WORK/run.$RANDOM sp=() wp=()
  mkdir -p "$run"
  for i in 0 1; do
    (cd "$run" && exec "$bin/server/ps/pstrain-ps" --host=127.0.0.1 --port=0 --port_file="$run/s$i" \
      --shard_index=$i --num_shards=2 >"$run/s$i.log" 2>&1 </dev/null) &
    sp+=($!)
  done
  wait_file "$run/s0" 30 && wait_file "$run/s1" 30 || { echo "shards did not start" >&2; exit 1; }
  local shards start
  shards="$(head -1 "$run/s0"),$(head -1 "$run/s1")"
  start=$(( $(date +%s%3N) + 3000 ))
  for w in 0 1; do
    "$bin/bench/pushpull_bench" --role=worker --shards="$shards" --model="$model" --worker=$w --num_workers=2 \
      --start_at_ms=$start --seconds=6 $(requests_flag "$bin") --wire_dtype="${AB_WIRE:-fp32}" >"$run/w$w.json" 2>"$run/w$w.log" </dev/null &
    wp+=($!)
  done
  wait "${wp[@]}"
  kill "${sp[@]}" 2>/dev/null; wait "${sp[@]}" 2>/dev/null
  $PY -c 'import json,sys; print(round(sum(json.loads(open(p).read().strip().splitlines()[-1])["gb_per_s"] for p in sys.argv[1:]), 3))' \
    "$run/w0.json" "$run/w1.json"
}
for model in flat mixed; do
  for ((r = 1; r <= reps; r++)); do
    a=$(once "$old" $model); b=$(once "$new" $model)
    echo "$model old $a new $b"
  done
done | tee "$WORK/pairs"
$PY - "$WORK/pairs" <<'PYEOF'
import json, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
out = {}
for model in ("flat", "mixed"):
    old = [float(r[2]) for r in rows if r[0] == model]
    new = [float(r[4]) for r in rows if r[0] == model]
    out[model] = {"old_gb_per_s": statistics.median(old), "new_gb_per_s": statistics.median(new),
                  "new_vs_old": round(statistics.median(new) / statistics.median(old), 3)}
print(json.dumps({"bench": "ab_pushpull", **out}))
PYEOF
