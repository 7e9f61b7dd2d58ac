# bench/run.sh embeddings [REPS]: sparse embedding tables (docs/embeddings.md)
# against PyTorch's nn.EmbeddingBag(sparse=True). Sourced by bench/run.sh
# (its BIN, PY, WORK, PIDS, log, wait_file, free_port, median and col).
#
# Data: criteo_gen (a planted model, Zipf ids; the meta file gives the Bayes
# AUC), EMB_TRAIN lines to train on, EMB_TEST to test, EMB_IDS ids per field.
# Lines, each REPS times (medians):
#   pstrain async   examples/criteo_synth.yaml's job: DLRM, 26 tables of dim
#                   16 (Adagrad), 2 shards, 2 workers x batch 128, one epoch,
#                   each table capped at EMB_CAP_MB per shard;
#   pstrain hybrid  the same with mode: allreduce (the dense part all-reduced,
#                   the rows on the shards); "not supported yet" while the
#                   spec refuses it;
#   pstrain async, replicas 1  the async job with each shard's rows (and
#                   dense chunks) backed up on the other shard
#                   (docs/replication.md): what replication costs;
#   torch           bench/torch_dlrm.py, one process, batch 256 (the global
#                   batch), EMB_TORCH_THREADS threads (1); torch DDP: 2 ranks (gloo) x batch 128,
#                   1 thread each. Tables of EMB_IDS rows (id mod rows).
# Then the scale line: the capped job on data with EMB_SCALE x the ids.
# Peak RSS: workers under /usr/bin/time (%M), shards' VmHWM read before
# they are stopped; rows held and evictions from the shards'
# EmbeddingService.Stats (bench/embedding_stats) before they are stopped.

EMB_IDS=${EMB_IDS:-100000}
EMB_SCALE=${EMB_SCALE:-100}
EMB_TRAIN=${EMB_TRAIN:-200000}
EMB_TEST=${EMB_TEST:-20000}
EMB_CAP_MB=${EMB_CAP_MB:-4}
# The one-process peer's threads: 1 is its fastest here (2 threads: 20.5k
# samples/s on a quiet machine against 24.4k with 1, and OpenMP's spinning
# collapses to under 1k when other processes load the 2 cores).
EMB_TORCH_THREADS=${EMB_TORCH_THREADS:-1}

emb_gen() {  # emb_gen DATA_ROOT IDS -> the Bayes AUC
  mkdir -p "$1/criteo"
  $BIN/worker/criteo_gen --id_space "$2" --train_examples "$EMB_TRAIN" --test_examples "$EMB_TEST" \
    --out_train "$1/criteo/train.tsv" --out_test "$1/criteo/test.tsv" --out_meta "$1/criteo/meta.txt" >&2
  awk '$1 == "bayes_auc" {print $2}' "$1/criteo/meta.txt"
}

emb_spec() {  # emb_spec FILE async|hybrid CAP_MB [REPLICAS]: examples/criteo_synth.yaml, capped, standalone
  local cap=$3
  sed -e 's/^name: .*/name: embbench/' \
    -e "s/optimizer: {kind: adagrad, lr: 0.05}}/optimizer: {kind: adagrad, lr: 0.05}, eviction: {max_memory_mb: $cap}}/" \
    examples/criteo_synth.yaml >"$1"
  echo "log_every_steps: 100" >>"$1"
  [ "${4:-0}" != 0 ] && echo "replicas: $4" >>"$1"
  if [ "$2" = hybrid ]; then
    # PERSIA's hybrid: the rows asynchronous on the shards (the example's
    # consistency: async), the dense part all-reduced.
    printf 'mode: allreduce\nbackend: gloo\n' >>"$1"
  fi
}

# One pstrain run on 2 shards and 2 workers started here (no coordinator:
# nothing drops the tables before their Stats are read) ->
# "samples/s auc worker_rss_mb shard_rss_mb rows evicted" (RSS: the larger
# of the two), or "unsupported" when the spec is refused as not built yet.
emb_ours_once() {  # emb_ours_once async|hybrid DATA_ROOT CAP_MB [REPLICAS]
  local run=$WORK/emb.$RANDOM pids=() wpids=() targets="" port
  mkdir -p "$run"
  emb_spec "$run/job.yaml" "$1" "$3" "${4:-0}"
  for i in 0 1; do
    $BIN/server/ps/pstrain-ps --host=127.0.0.1 --port=0 --port_file="$run/s$i" --shard_index=$i \
      --num_shards=2 >"$run/s$i.log" 2>&1 &
    pids+=($!); PIDS+=($!)
  done
  for i in 0 1; do wait_file "$run/s$i" 30; targets+="${targets:+,}$(head -1 "$run/s$i")"; done
  port=$(free_port)
  for w in 0 1; do
    # One BLAS and OpenMP thread, as pstrain local gives its workers (an idle
    # OpenBLAS thread spinning in sched_yield doubled a worker's CPU time).
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 RANK=$w WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      /usr/bin/time -f %M -o "$run/w$w.rss" $BIN/worker/pstrain-worker --spec="$run/job.yaml" --rank=$w \
        --world_size=2 --shards="$targets" --data_root="$2" --output_dir="$run/out" \
      >"$run/w$w.jsonl" 2>"$run/w$w.log" &
    wpids+=($!)
  done
  local failed=0
  for p in "${wpids[@]}"; do wait "$p" || failed=1; done
  local stats="" hwm=0 h
  [ $failed = 0 ] && stats=$($BIN/bench/embedding_stats --shards="$targets" --job=embbench)
  for p in "${pids[@]}"; do
    h=$(awk '/^VmHWM:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
    [ "${h:-0}" -gt "$hwm" ] && hwm=$h
  done
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  if [ $failed = 1 ]; then
    # A spec the worker refuses (hybrid, until it is built): its error names
    # the spec file. Anything else fails the bench.
    local refusal; refusal=$(grep -h "\[error\].*job.yaml: " "$run"/w*.jsonl "$run"/w*.log | head -1 || true)
    if [ -n "$refusal" ]; then
      log "pstrain $1: the spec is refused: ${refusal#*job.yaml: }"
      echo unsupported; return
    fi
    tail -n 20 "$run"/w*.log "$run"/w*.jsonl >&2; exit 1
  fi
  $PY - "$stats" "$hwm" "$run"/w0.rss "$run"/w1.rss "$run"/w0.jsonl "$run"/w1.jsonl <<'PYEOF'
import json, sys
stats, hwm = json.loads(sys.argv[1])["total"], int(sys.argv[2])
rss = max(int(open(p).read().split()[-1]) for p in sys.argv[3:5])
done, auc = [], None
for path in sys.argv[5:]:
    for line in open(path):
        if not line.startswith("{"):
            continue  # the log lines among the events
        e = json.loads(line)
        if "done" in e:
            done.append(e["done"])
        if "eval" in e and e["eval"].get("final"):
            auc = e["eval"]["auc"]
seconds = max(d["seconds"] for d in done)
print(sum(int(d["samples"]) for d in done) / seconds, auc, rss / 1024, hwm / 1024, stats["rows"],
      stats["evicted_lru"] + stats["evicted_ttl"])
PYEOF
}

emb_torch_once() {  # emb_torch_once WORKERS BATCH THREADS DATA_ROOT ROWS -> "samples/s auc rss_mb_max"
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=$3 $PY bench/torch_dlrm.py --train "$4/criteo/train.tsv" --test "$4/criteo/test.tsv" --rows "$5" \
    --workers "$1" --batch "$2" --threads "$3" 2>"$WORK/torch_dlrm.log" | tail -1 \
    | $PY -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r["samples_per_s"], r["auc"], max(r["peak_rss_mb"]))' \
    || { tail -5 "$WORK/torch_dlrm.log" >&2; exit 1; }
}

embeddings() {
  local reps=${1:-3} base=$WORK/emb-data big=$WORK/emb-data-big
  local ids_big; ids_big=$(awk -v a="$EMB_IDS" -v s="$EMB_SCALE" 'BEGIN {printf "%.0f", a * s}')
  if [ -z "${PSTRAIN_BIN:-}" ]; then  # given binaries (the smoke test's) are not rebuilt
    log "building"
    bazel build //server/ps:pstrain-ps //worker:pstrain-worker //worker:criteo_gen //bench:embedding_stats >&2
  fi
  log "data: $EMB_TRAIN + $EMB_TEST lines, $EMB_IDS and $ids_big ids per field"
  local bayes bayes_big
  bayes=$(emb_gen "$base" "$EMB_IDS"); bayes_big=$(emb_gen "$big" "$ids_big")
  declare -A runs
  for r in $(seq "$reps"); do
    log "rep $r/$reps: pstrain async"; runs[async]+="$(emb_ours_once async "$base" "$EMB_CAP_MB")"$'\n'
    log "rep $r/$reps: pstrain hybrid"; runs[hybrid]+="$(emb_ours_once hybrid "$base" "$EMB_CAP_MB")"$'\n'
    log "rep $r/$reps: pstrain async, replicas 1"; runs[r1]+="$(emb_ours_once async "$base" "$EMB_CAP_MB" 1)"$'\n'
    log "rep $r/$reps: torch, one process"; runs[torch]+="$(emb_torch_once 1 256 "$EMB_TORCH_THREADS" "$base" "$EMB_IDS")"$'\n'
    log "rep $r/$reps: torch DDP (gloo, 2 ranks)"; runs[ddp]+="$(emb_torch_once 2 128 1 "$base" "$EMB_IDS")"$'\n'
    log "rep $r/$reps: pstrain async, ${EMB_SCALE}x ids"; runs[big]+="$(emb_ours_once async "$big" "$EMB_CAP_MB")"$'\n'
  done
  local hybrid_ok=1
  [[ ${runs[hybrid]} == *unsupported* ]] && { hybrid_ok=0; runs[hybrid]=""; }
  printf '\n%-34s %10s %8s %10s %10s %10s %10s   (medians of %s runs; DLRM, %s lines, 26 fields, dim 16)\n' \
    "embeddings" "samples/s" "AUC" "worker MB" "shard MB" "rows" "evicted" "$reps" "$EMB_TRAIN" >&2
  local k label
  for k in async hybrid r1 torch ddp big; do
    case $k in
      async) label="pstrain async, $EMB_IDS ids" ;; hybrid) label="pstrain hybrid, $EMB_IDS ids" ;;
      r1) label="pstrain async, replicas 1" ;;
      torch) label="torch, one process" ;; ddp) label="torch DDP (gloo, 2 ranks)" ;;
      big) label="pstrain async, $ids_big ids" ;;
    esac
    if [ $k = hybrid ] && [ $hybrid_ok = 0 ]; then printf '%-34s %10s\n' "$label" "not supported yet" >&2; continue; fi
    if [ $k = torch ] || [ $k = ddp ]; then
      printf '%-34s %10.0f %8.4f %10.0f\n' "$label" "$(col $k 1)" "$(col $k 2)" "$(col $k 3)" >&2
    else
      printf '%-34s %10.0f %8.4f %10.0f %10.0f %10.0f %10.0f\n' "$label" "$(col $k 1)" "$(col $k 2)" \
        "$(col $k 3)" "$(col $k 4)" "$(col $k 5)" "$(col $k 6)" >&2
    fi
  done
  printf 'Bayes AUC: %s (%s ids), %s (%s ids)\n' "$bayes" "$EMB_IDS" "$bayes_big" "$ids_big" >&2
  $PY - <<PYEOF
import json
def line(k, v):
    keys = ("samples_per_s", "auc", "worker_rss_mb", "shard_rss_mb", "rows_held", "evicted")
    return dict(zip(keys, (round(x, 4) for x in v)))
a = line("async", ($(col async 1), $(col async 2), $(col async 3), $(col async 4), $(col async 5), $(col async 6)))
r1 = line("r1", ($(col r1 1), $(col r1 2), $(col r1 3), $(col r1 4), $(col r1 5), $(col r1 6)))
h = line("hybrid", ($(col hybrid 1), $(col hybrid 2), $(col hybrid 3), $(col hybrid 4), $(col hybrid 5), $(col hybrid 6)))
big = line("big", ($(col big 1), $(col big 2), $(col big 3), $(col big 4), $(col big 5), $(col big 6)))
t = {"samples_per_s": $(col torch 1), "auc": $(col torch 2), "peak_rss_mb": $(col torch 3)}
d = {"samples_per_s": $(col ddp 1), "auc": $(col ddp 2), "peak_rss_mb_max_rank": $(col ddp 3)}
ids, ids_big, dim, tables = $EMB_IDS, $ids_big, 16, 26
need = lambda rows: tables * rows * dim * 4 * (1 + 1)  # bytes: value + Adagrad's sum per element
ratio = lambda x, y: round(x / y, 3) if x and y else 0
print(json.dumps({
    "bench": "embeddings", "reps": $reps,
    "setup": "DLRM (criteo_synth.yaml: 26 tables x dim 16, Adagrad), $EMB_TRAIN train / $EMB_TEST test lines of criteo_gen "
             "data, 1 epoch; pstrain 2 shards + 2 workers x batch 128, tables capped at $EMB_CAP_MB MB per shard; "
             "torch: EmbeddingBag(sparse=True), $EMB_IDS rows per table (id mod rows), Adagrad",
    "bayes_auc": $bayes, "bayes_auc_scaled": $bayes_big,
    "pstrain_async": a, "pstrain_hybrid": h if $hybrid_ok else "not supported yet", "pstrain_async_replicas_1": r1,
    "torch_one_process": t, "torch_ddp_gloo_2": d,
    "scale": {"ids_per_field": ids_big, "pstrain_async": big,
              "torch_full_table_bytes_per_process": need(ids_big),
              "torch_full_table_gib_per_process": round(need(ids_big) / 2**30, 2),
              "torch_table_gib_per_process_at_1x": round(need(ids) / 2**30, 3)},
    "ratios": {"vs_torch_ddp": ratio(a["samples_per_s"], d["samples_per_s"]),
               "vs_torch_single": ratio(a["samples_per_s"], t["samples_per_s"]),
               "hybrid_vs_torch_ddp": ratio(h["samples_per_s"], d["samples_per_s"]) if $hybrid_ok else None,
               "auc_vs_torch_ddp": round(a["auc"] - d["auc"], 4),
               "replicas_vs_none": ratio(r1["samples_per_s"], a["samples_per_s"]),
               "worker_rss_growth": ratio(big["worker_rss_mb"], a["worker_rss_mb"]),
               "shard_rss_growth": ratio(big["shard_rss_mb"], a["shard_rss_mb"]),
               "auc_gap_to_bayes": round($bayes - a["auc"], 4),
               "auc_gap_to_bayes_scaled": round($bayes_big - big["auc"], 4)},
}))
PYEOF
}
