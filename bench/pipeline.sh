# bench/run.sh pipeline [REPS]: pipelined jobs (docs/pipeline.md) against
# PyTorch 1.13's Pipe. Sourced by bench/run.sh (its BIN, PY, WORK, PIDS,
# log, free_port, median and col).
#
# The model: mlp_deep (784 -> 1024 x 7 -> 10, 8 Linear layers, 7.1M
# parameters), synthetic 1x28x28 data, batch PIPE_BATCH, PIPE_STEPS steps.
# Lines, each REPS times (medians):
#   pstrain P stages, M = 4P micro-batches, gpipe and 1f1b, for P = 2 and 4:
#     P worker processes launched the torchrun way (one replica), each with
#     one thread (threads_per_worker 1), under /usr/bin/time (peak RSS);
#     samples/s from rank 0's done event; each stage's bubble (the share of
#     its step it waited for a neighbour) from its progress events, the
#     first window left out; the schedule's theory: (P-1)/(M+P-1);
#   pstrain unpipelined: one all-reduce worker, the same batch;
#   torch Pipe: bench/torch_pipe.py, the same model cut into P partitions,
#     chunks = M, one process, PIPE_TORCH_THREADS (2) threads; and the model
#     without Pipe.

PIPE_BATCH=${PIPE_BATCH:-512}
PIPE_STEPS=${PIPE_STEPS:-20}
PIPE_TORCH_THREADS=${PIPE_TORCH_THREADS:-2}

pipe_spec() {  # pipe_spec FILE STAGES MICRO SCHEDULE (STAGES 0: unpipelined, one worker)
  local workers=$2
  [ "$2" = 0 ] && workers=1
  cat >"$1" <<YAML
name: pipebench
mode: allreduce
model: mlp_deep
data: {format: synthetic, synthetic_train: $((PIPE_BATCH * PIPE_STEPS)), synthetic_test: 100}
workers: $workers
batch_size: $PIPE_BATCH
epochs: 1
optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}
log_every_steps: 5
YAML
  [ "$2" = 0 ] || echo "pipeline: {stages: $2, micro_batches: $3, schedule: $4}" >>"$1"
}

# One pstrain run -> "samples/s bubble_stage_0 ... rss_mb_stage_0 ... held_stage_0 ..." (per stage: the
# bubble, the peak RSS, the most micro-batches whose activations it held).
pipe_ours_once() {  # pipe_ours_once STAGES MICRO SCHEDULE
  local run=$WORK/pipe.$RANDOM port ranks=$1 pids=() pid r
  [ "$1" = 0 ] && ranks=1
  mkdir -p "$run"
  pipe_spec "$run/job.yaml" "$@"
  port=$(free_port)
  for r in $(seq 0 $((ranks - 1))); do
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 RANK=$r WORLD_SIZE=$ranks LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port /usr/bin/time -f %M -o "$run/w$r.rss" $BIN/worker/pstrain-worker --spec="$run/job.yaml" \
        --output_dir="$run/out" --gloo_hostname=127.0.0.1 >"$run/w$r.jsonl" 2>"$run/w$r.log" &
    pids+=($!); PIDS+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { tail -5 "$run"/w*.log >&2; exit 1; }; done
  $PY - "$run" "$ranks" <<'PYEOF'
import json, statistics, sys
run, ranks = sys.argv[1], int(sys.argv[2])
rate, bubbles, rss, held = 0, [], [], []
for r in range(ranks):
    windows, most = [], 0
    for line in open(f"{run}/w{r}.jsonl"):
        if not line.startswith("{"):
            continue
        e = json.loads(line)
        if "done" in e and r == 0:
            rate = int(e["done"]["samples"]) / e["done"]["seconds"]
        if "progress" in e:
            windows.append(e["progress"].get("bubble", 0))
            most = max(most, e["progress"].get("held_micro_batches", 0))
    bubbles.append(statistics.median(windows[1:] or windows or [0]))
    rss.append(int(open(f"{run}/w{r}.rss").read().split()[-1]) / 1024)
    held.append(most)
print(rate, " ".join(f"{b:.4f}" for b in bubbles), " ".join(f"{m:.0f}" for m in rss), " ".join(map(str, held)))
PYEOF
}

pipe_torch_once() {  # pipe_torch_once STAGES CHUNKS [--plain] -> "samples/s rss_mb"
  OPENBLAS_NUM_THREADS=$PIPE_TORCH_THREADS OMP_NUM_THREADS=$PIPE_TORCH_THREADS $PY bench/torch_pipe.py \
    --stages "$1" --chunks "$2" --batch "$PIPE_BATCH" --steps "$PIPE_STEPS" --threads "$PIPE_TORCH_THREADS" ${3:-} \
    2>"$WORK/torch_pipe.log" | tail -1 | $PY -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r["samples_per_s"], r["peak_rss_mb"])' \
    || { tail -5 "$WORK/torch_pipe.log" >&2; exit 1; }
}

pipeline() {
  local reps=${1:-3} r p s out=$WORK/pipeline-runs
  if [ -z "${PSTRAIN_BIN:-}" ]; then  # given binaries (the smoke test's) are not rebuilt
    log "building"
    bazel build //worker:pstrain-worker >&2
  fi
  mkdir -p "$out"
  for r in $(seq "$reps"); do
    log "rep $r/$reps: pstrain unpipelined"; pipe_ours_once 0 1 1f1b >>"$out/plain"
    log "rep $r/$reps: torch without Pipe"; pipe_torch_once 1 1 --plain >>"$out/torch_plain"
    for p in 2 4; do
      for s in gpipe 1f1b; do
        log "rep $r/$reps: pstrain P=$p M=$((4 * p)) $s"; pipe_ours_once $p $((4 * p)) $s >>"$out/$s$p"
      done
      log "rep $r/$reps: torch Pipe P=$p chunks=$((4 * p))"; pipe_torch_once $p $((4 * p)) >>"$out/torch$p"
    done
  done
  $PY - "$out" "$reps" "$PIPE_BATCH" "$PIPE_STEPS" "$PIPE_TORCH_THREADS" <<'PYEOF'
import json, statistics, sys
out, reps, batch, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
def rows(k):
    return [list(map(float, l.split())) for l in open(f"{out}/{k}") if l.strip()]
def med(k):  # the median of each column over the runs
    r = rows(k)
    return [statistics.median(c) for c in zip(*r)]
lines, table = {}, []
for k, stages in (("plain", 1), ("gpipe2", 2), ("1f1b2", 2), ("gpipe4", 4), ("1f1b4", 4)):
    m = med(k)
    micro = 4 * stages if stages > 1 else 1
    theory = (stages - 1) / (micro + stages - 1)
    line = {"stages": stages, "micro_batches": micro, "samples_per_s": round(m[0], 1),
            "bubble_per_stage": [round(x, 3) for x in m[1:1 + stages]], "bubble_theory": round(theory, 3),
            "peak_rss_mb_per_stage": [round(x) for x in m[1 + stages:1 + 2 * stages]],
            "held_micro_batches_per_stage": [round(x) for x in m[1 + 2 * stages:1 + 3 * stages]]}
    lines[k] = line
    label = "pstrain, one worker" if k == "plain" else f"pstrain {k[:-1]}, P={stages} M={micro}"
    table.append(f"{label:<28} {m[0]:>10.0f}  {' '.join(f'{b:.2f}' for b in line['bubble_per_stage']):<22} "
                 f"{theory if stages > 1 else 0:>6.3f}  {' '.join(str(x) for x in line['peak_rss_mb_per_stage']):<22} "
                 f"{' '.join(str(x) for x in line['held_micro_batches_per_stage'])}")
torch = {}
for k, label in (("torch_plain", "torch, no Pipe"), ("torch2", "torch Pipe, P=2 chunks=8"), ("torch4", "torch Pipe, P=4 chunks=16")):
    m = med(k)
    torch[k] = {"samples_per_s": round(m[0], 1), "peak_rss_mb": round(m[1])}
    table.append(f"{label:<28} {m[0]:>10.0f}  {'':<22} {'':>6}  {m[1]:.0f}")
print(f"\n{'pipeline (mlp_deep, batch ' + str(batch) + ')':<28} {'samples/s':>10}  {'bubble per stage':<22} {'theory':>6}  "
      f"{'peak RSS MB per stage':<22} held micro-batches   (medians of {reps} runs)", file=sys.stderr)
print("\n".join(table), file=sys.stderr)
best = lambda p: max(lines[f"gpipe{p}"]["samples_per_s"], lines[f"1f1b{p}"]["samples_per_s"])
ratio = lambda x, y: round(x / y, 3) if x and y else 0
def bubble_ratio(k):  # the worst stage's measured bubble over the theory
    l = lines[k]
    return round(max(l["bubble_per_stage"]) / l["bubble_theory"], 2)
print(json.dumps({
    "bench": "pipeline", "reps": reps,
    "setup": f"mlp_deep (8 Linear layers, 7.1M parameters), synthetic 1x28x28, batch {batch}, {steps} steps, SGD momentum; "
             f"pstrain: P worker processes (1 thread each), M = 4P; torch: Pipe (GPipe) with chunks = M, one process, "
             f"{threads} threads",
    "pstrain": lines, "torch": torch,
    "ratios": {"vs_torch_pipe_p2": ratio(best(2), torch["torch2"]["samples_per_s"]),
               "vs_torch_pipe_p4": ratio(best(4), torch["torch4"]["samples_per_s"]),
               "bubble_vs_theory_1f1b_p2": bubble_ratio("1f1b2"), "bubble_vs_theory_1f1b_p4": bubble_ratio("1f1b4"),
               "bubble_vs_theory_gpipe_p2": bubble_ratio("gpipe2"), "bubble_vs_theory_gpipe_p4": bubble_ratio("gpipe4"),
               "rss_1f1b_vs_gpipe_p4_stage0": ratio(lines["1f1b4"]["peak_rss_mb_per_stage"][0],
                                                    lines["gpipe4"]["peak_rss_mb_per_stage"][0]),
               # 1F1B's activations against P micro-batches' (the target: <= 1.2); GPipe holds M = 4P.
               "held_1f1b_vs_p_p4": ratio(max(lines["1f1b4"]["held_micro_batches_per_stage"]), 4),
               "held_gpipe_vs_p_p4": ratio(max(lines["gpipe4"]["held_micro_batches_per_stage"]), 4)},
}))
PYEOF
}
