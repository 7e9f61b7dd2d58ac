#!/usr/bin/env bash
# Benchmarks with their peers measured in the same run.
#
#   bench/run.sh pushpull [REPS]   pstrain push+pull vs torch.distributed.rpc
#                                  and loopback TCP (iperf3); codec speed;
#                                  pstrain over TLS with tokens (tls_vs_plain); and
#                                  with replicas: 1 (replicas_vs_none)
#   bench/run.sh train [REPS]      the demo job (async), its sync and all-reduce
#                                  variants vs PyTorch DDP (gloo), same settings
#   bench/run.sh allreduce [REPS]  all-reduce time and bus bandwidth, 4 KB..256 MB,
#                                  2 and 4 ranks, vs torch.distributed (gloo)
#   bench/run.sh elastic [REPS]    a worker SIGKILLed in a 3-worker PS job: how long
#                                  the survivors stand still and when a spare takes
#                                  over (sync, async), vs the restart from a checkpoint
#                                  that the same loss cost before (tests/elastic_test)
#   bench/run.sh replication [REPS]  a shard SIGKILLed in a 3-shard job with replicas: 1 (mlp; dlrm):
#                                  seconds to 5 more steps (sync, async), no restart,
#                                  and whether each sync run ended bitwise equal to
#                                  the uninterrupted one (tests/replication_test)
#   bench/run.sh comm [REPS]       a communication-bound job (a 5.8M-parameter MLP,
#                                  2 workers, sync): pstrain PS with fp32 and bf16
#                                  wire, all-reduce fp32 and fp16, vs PyTorch DDP (gloo)
#                                  without a hook and with fp16/bf16_compress_hook;
#                                  samples/s, accuracy, loopback bytes per step
#   bench/run.sh gpu [REPS]        ResNet-18 on one GPU: PS mode (2 workers, CPU
#                                  shards) and all-reduce (NCCL, 1 rank) vs PyTorch
#                                  in one process and DDP (NCCL, 1 rank); needs a
#                                  CUDA LibTorch (tools/gpu/run.sh runs it there);
#                                  GPU_PRECISION=bf16|fp16 trains both sides under
#                                  autocast (fp16: loss scaling on both); GPU_WIRE=bf16
#                                  halves pstrain's bytes to and from the shards (ps);
#                                  GPU_REQUESTS_IN_FLIGHT (default 2; 0: no limit);
#                                  GPU_DEVICE=cpu runs it all on the CPU (Gloo)
#   bench/run.sh embeddings [REPS] DLRM on criteo_gen data: pstrain's sparse tables
#                                  (2 shards, 2 workers, async; hybrid) vs PyTorch
#                                  EmbeddingBag(sparse=True), one process and DDP
#                                  (gloo); then 100x the ids (bench/embeddings.sh)
#   bench/run.sh embckpt [REPS]    a shard's embedding table (2M rows, dim 16, Adagrad)
#                                  checkpointed incrementally after 1%, 10% and 50% of
#                                  its rows trained, vs saving it whole at that point:
#                                  bytes, seconds to save and to restore (the chain vs
#                                  the whole file), medians of REPS
#   bench/run.sh quantize          int8 exports (docs/quantization.md): an MLP and a
#                                  LeNet trained by pstrain local (fp32, and QAT),
#                                  exported dynamic, static and from QAT by
#                                  pstrain-quantize, vs PyTorch's own quantize_dynamic,
#                                  FX static and FX QAT of the same fp32 weights:
#                                  size, 1-thread latency, accuracy
#   bench/run.sh pipeline [REPS]   a pipelined job (mlp_deep, P = 2 and 4 stages, M = 4P,
#                                  GPipe and 1F1B): samples/s, each stage's bubble against
#                                  the schedule's theory, peak RSS per stage, vs PyTorch's
#                                  Pipe (bench/pipeline.sh)
#
# Prints a readable table and, as its last line, one JSON object.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PSTRAIN_PY:-/usr/bin/python3}   # Debian's, with python3-torch
BIN=${PSTRAIN_BIN:-bazel-bin}         # where the binaries are, laid out as Bazel's
# The workers' --data_root: the specs' data.dir (fashion-mnist) lies under it.
DATA_ROOT=${PSTRAIN_DATA_ROOT:-/usr/share/datasets}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pstrain-bench.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

log() { echo "[bench] $*" >&2; }

wait_file() {  # wait_file PATH SECONDS
  local deadline=$((SECONDS + $2))
  until [ -s "$1" ]; do
    [ $SECONDS -lt $deadline ] || { echo "no address in $1" >&2; exit 1; }
    sleep 0.05
  done
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
# col KEY [FIELD]: the median of field FIELD (default 1) over the lines a
# bench gathered in runs[KEY], the `declare -A runs` of the bench function
# that calls it (bash's dynamic scope). No lines (a key never run) give 0,
# the median of nothing.
col() { printf '%s' "${runs[$1]:-}" | awk -v f="${2:-1}" 'NF {print $f}' | median; }
# The table of pstrain_once medians (samples/s, accuracy, seconds), one row
# per KEY of the caller's runs, labelled PREFIX KEY.
pstrain_table() {  # pstrain_table TITLE NOTE PREFIX KEY...
  local title=$1 note=$2 prefix=$3 k
  shift 3
  printf '\n%-28s %12s %10s %10s   (%s)\n' "$title" "samples/s" "accuracy" "seconds" "$note" >&2
  for k in "$@"; do
    printf '%-28s %12.0f %10.4f %10.1f\n' "$prefix$k" "$(col "$k" 1)" "$(col "$k" 2)" "$(col "$k" 3)" >&2
  done
}

free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# One pstrain run: 2 shard processes + 2 worker processes, timed together.
# With a third argument "tls": every call over TLS with a cluster token
# checked by the shards (the secured deployment's data plane).
ours_once() {  # ours_once MODEL SECONDS [tls] -> prints "gb_per_s p50 p99"
  local model=$1 secs=$2 run=$WORK/run.$RANDOM
  mkdir -p "$run"
  local server_sec=() client_sec=()
  local wire=fp32 requests=training
  [ "${3:-}" = bf16 ] && wire=bf16
  [ "${3:-}" = whole ] && requests=whole
  local replicas=0
  [ "${3:-}" = replicas ] && replicas=1
  if [ "${3:-}" = tls ]; then
    local c=$WORK/credentials
    [ -s "$c/ca.pem" ] || $BIN/bench/pushpull_bench --role=credentials --out="$c"
    server_sec=(--tls_cert="$c/member.pem" --tls_key="$c/member-key.pem" --tls_ca="$c/ca.pem"
                --token_auth_file="$c/tokens.csv")
    client_sec=(--tls_ca="$c/ca.pem" --token_file="$c/cluster.token")
  fi
  local shard_pids=()
  for i in 0 1; do
    $BIN/server/ps/pstrain-ps --host=127.0.0.1 --port=0 --port_file="$run/s$i" \
      --shard_index=$i --num_shards=2 "${server_sec[@]}" >"$run/s$i.log" 2>&1 &
    shard_pids+=($!); PIDS+=($!)
  done
  wait_file "$run/s0" 30; wait_file "$run/s1" 30
  local shards; shards="$(head -1 "$run/s0"),$(head -1 "$run/s1")"
  local start=$(( $(date +%s%3N) + 4000 ))
  local wpids=()
  for w in 0 1; do
    $BIN/bench/pushpull_bench --role=worker --shards="$shards" --model="$model" --worker=$w \
      --num_workers=2 --start_at_ms=$start --seconds="$secs" --wire_dtype=$wire --requests=$requests --replicas=$replicas "${client_sec[@]}" \
      >"$run/w$w.json" 2>"$run/w$w.log" &
    wpids+=($!)
  done
  for p in "${wpids[@]}"; do wait "$p" || { cat "$run"/w*.log >&2; exit 1; }; done
  kill "${shard_pids[@]}" 2>/dev/null || true
  wait "${shard_pids[@]}" 2>/dev/null || true
  $PY - "$run/w0.json" "$run/w1.json" <<'PYEOF'
import json, sys
rows = [json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[1:]]
print(sum(r["gb_per_s"] for r in rows), sorted(r["p50_ms"] for r in rows)[0], max(r["p99_ms"] for r in rows))
PYEOF
}

torch_once() {  # torch_once MODEL TRANSPORT SECONDS [ARGS...] -> "gb_per_s p50 p99"
  $PY bench/torch_rpc_ps.py --model "$1" --transport "$2" --seconds "$3" "${@:4}" 2>"$WORK/torch.log" \
    | tail -1 | $PY -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r["gb_per_s"], r["p50_ms"], r["p99_ms"])'
}

iperf_once() {
  local port; port=$(free_port)
  iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
  local spid=$!; PIDS+=($spid)
  sleep 0.5
  iperf3 -c 127.0.0.1 -p "$port" -t 4 -J | $PY -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9)'
  wait "$spid" 2>/dev/null || true
}

pushpull() {
  local reps=${1:-3} secs=${SECONDS_PER_RUN:-6}
  log "building"
  bazel build //server/ps:pstrain-ps //bench:pushpull_bench >&2
  declare -A runs
  for r in $(seq "$reps"); do
    for model in flat mixed; do
      # Plain and replicas: 1 side by side (alternating which goes first),
      # so that their ratio is taken over adjacent runs, not across a drift
      # of the machine.
      local plain replicated
      if (( r % 2 )); then
        log "rep $r/$reps: pstrain $model"
        plain="$(ours_once "$model" "$secs")"
        log "rep $r/$reps: pstrain $model, replicas: 1 (each update forwarded to a backup shard)"
        replicated="$(ours_once "$model" "$secs" replicas)"
      else
        log "rep $r/$reps: pstrain $model, replicas: 1 (each update forwarded to a backup shard)"
        replicated="$(ours_once "$model" "$secs" replicas)"
        log "rep $r/$reps: pstrain $model"
        plain="$(ours_once "$model" "$secs")"
      fi
      runs[ours_$model]+="$plain"$'\n'
      runs[ours_replicas_$model]+="$replicated"$'\n'
      runs[pair_replicas_$model]+="$($PY -c "print(${replicated%% *} / ${plain%% *})")"$'\n'
      log "rep $r/$reps: pstrain $model, one request per shard"
      runs[ours_whole_$model]+="$(ours_once "$model" "$secs" whole)"$'\n'
      log "rep $r/$reps: pstrain $model over TLS with tokens"
      runs[ours_tls_$model]+="$(ours_once "$model" "$secs" tls)"$'\n'
      log "rep $r/$reps: pstrain $model, bf16 wire"
      runs[ours_bf16_$model]+="$(ours_once "$model" "$secs" bf16)"$'\n'
      for tr in tcp default; do
        log "rep $r/$reps: torch.distributed.rpc ($tr) $model"
        runs[torch_${tr}_$model]+="$(torch_once "$model" "$tr" "$secs")"$'\n'
      done
      log "rep $r/$reps: torch.distributed.rpc (tcp) $model, one request per chunk, 2 in flight per shard"
      runs[torch_tcp_turns_$model]+="$(torch_once "$model" tcp "$secs" --in-flight 2)"$'\n'

    done
    log "rep $r/$reps: iperf3 loopback"
    runs[iperf]+="$(iperf_once)"$'\n'
  done
  log "codec"
  codec=$($BIN/bench/pushpull_bench --role=codec | tail -1)

  local keys=(ours_flat ours_mixed ours_whole_flat ours_whole_mixed ours_tls_flat ours_tls_mixed ours_bf16_flat ours_bf16_mixed ours_replicas_flat ours_replicas_mixed torch_tcp_flat torch_tcp_mixed torch_tcp_turns_flat torch_tcp_turns_mixed torch_default_flat torch_default_mixed)
  printf '\n%-24s %10s %10s %10s   (medians of %s runs, 2 shards + 2 workers, 10M float32; GB/s of float32 parameters, also for bf16)\n' \
    "push+pull" "GB/s" "p50 ms" "p99 ms" "$reps" >&2
  for k in "${keys[@]}"; do
    printf '%-24s %10.3f %10.1f %10.1f\n' "$k" "$(col "$k" 1)" "$(col "$k" 2)" "$(col "$k" 3)" >&2
  done
  printf '%-24s %10.3f\n' "iperf3 loopback" "$(col iperf 1)" >&2
  printf '%-24s %s / %s\n' "replicas:1 / 0, by rep" "$(printf '%s' "${runs[pair_replicas_flat]}" | awk 'NF {printf "%.3f ", $1}')" \
    "$(printf '%s' "${runs[pair_replicas_mixed]}" | awk 'NF {printf "%.3f ", $1}')" >&2
  printf 'codec: %s\n\n' "$codec" >&2

  $PY - "$codec" <<PYEOF
import json, sys
codec = json.loads(sys.argv[1])
ours_flat, ours_mixed = $(col ours_flat 1), $(col ours_mixed 1)
tcp_flat, tcp_mixed = $(col torch_tcp_flat 1), $(col torch_tcp_mixed 1)
turns_flat, turns_mixed = $(col torch_tcp_turns_flat 1), $(col torch_tcp_turns_mixed 1)
whole_flat, whole_mixed = $(col ours_whole_flat 1), $(col ours_whole_mixed 1)
dflt_flat, dflt_mixed = $(col torch_default_flat 1), $(col torch_default_mixed 1)
iperf = $(col iperf 1)
out = {
    "bench": "pushpull", "reps": $reps, "seconds_per_run": $secs,
    "setup": "2 shards + 2 workers on 127.0.0.1, 10M float32, a push-pull of the whole model every step",
    "ours_gb_per_s": {"flat": ours_flat, "mixed": ours_mixed},
    "ours_one_request_per_shard_gb_per_s": {"flat": whole_flat, "mixed": whole_mixed},
    "ours_p50_ms": {"flat": $(col ours_flat 2), "mixed": $(col ours_mixed 2)},
    "ours_p99_ms": {"flat": $(col ours_flat 3), "mixed": $(col ours_mixed 3)},
    "ours_tls_gb_per_s": {"flat": $(col ours_tls_flat 1), "mixed": $(col ours_tls_mixed 1)},
    "ours_replicas_1_gb_per_s": {"flat": $(col ours_replicas_flat 1), "mixed": $(col ours_replicas_mixed 1)},
    "ours_params_per_s": {"fp32": ours_flat * 1e9 / 4, "bf16": $(col ours_bf16_flat 1) * 1e9 / 4,
                          "fp32_mixed": ours_mixed * 1e9 / 4, "bf16_mixed": $(col ours_bf16_mixed 1) * 1e9 / 4},
    "torch_rpc_tcp_gb_per_s": {"flat": tcp_flat, "mixed": tcp_mixed},
    "torch_rpc_tcp_turns_gb_per_s": {"flat": turns_flat, "mixed": turns_mixed},
    "torch_rpc_default_gb_per_s": {"flat": dflt_flat, "mixed": dflt_mixed},
    "iperf3_loopback_gb_per_s": iperf,
    "codec_encode_gb_per_s": codec["encode_gb_per_s"],
    "codec_decode_gb_per_s": codec["decode_gb_per_s"],
    "ratios": {
        "vs_torch_rpc_tcp": round(ours_flat / tcp_flat, 3),
        "vs_torch_rpc_tcp_best": round(ours_flat / max(tcp_flat, turns_flat), 3),
        "one_request_per_shard_vs_torch_rpc_tcp": round(whole_flat / tcp_flat, 3),
        "vs_torch_rpc_default": round(ours_flat / dflt_flat, 3),
        "vs_loopback_tcp": round(ours_flat / iperf, 3),
        "mixed_vs_torch_rpc_tcp": round(ours_mixed / tcp_mixed, 3),
        "mixed_vs_torch_rpc_tcp_best": round(ours_mixed / max(tcp_mixed, turns_mixed), 3),
        "mixed_vs_torch_rpc_default": round(ours_mixed / dflt_mixed, 3),
        "tls_vs_plain": round($(col ours_tls_flat 1) / ours_flat, 3),
        "mixed_tls_vs_plain": round($(col ours_tls_mixed 1) / ours_mixed, 3),
        "bf16_vs_fp32_params_per_s": round($(col ours_bf16_flat 1) / ours_flat, 3),
        # The median of each rep's ratio of adjacent runs; and the ratio of
        # the two lines' medians.
        "replicas_vs_none": round($(col pair_replicas_flat 1), 3),
        "mixed_replicas_vs_none": round($(col pair_replicas_mixed 1), 3),
        "replicas_vs_none_of_medians": round($(col ours_replicas_flat 1) / ours_flat, 3),
        "mixed_replicas_vs_none_of_medians": round($(col ours_replicas_mixed 1) / ours_mixed, 3),
    },
}
print(json.dumps(out))
PYEOF
}

# One `pstrain local` run -> "samples_per_s accuracy seconds".
pstrain_once() {  # pstrain_once SPEC
  local out=$WORK/train.$RANDOM
  bazel-bin/client/pstrain local "$1" --output_dir "$out" --data_root "$DATA_ROOT" >"$out.log" 2>&1 || { cat "$out.log" >&2; exit 1; }
  sed -n 's/^done: \([0-9.]*\) s, \([0-9.]*\) samples\/s, final test accuracy \([0-9.]*\).*/\2 \3 \1/p' "$out.log"
}

ddp_once() {
  $PY bench/torch_ddp_train.py --workers 2 --epochs 3 --batch 64 --lr 0.05 --threads 1 2>"$WORK/ddp.log" \
    | tail -1 | $PY -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r["samples_per_s"], r["accuracy"], r["seconds"])'
}

# Bytes through the loopback interface so far (both directions count once:
# every byte sent on lo is received on lo).
lo_bytes() { awk '/^ *lo:/ {print $2}' /proc/net/dev; }

comm_spec() {  # comm_spec MODE WIRE -> a spec file
  local f=$WORK/comm-$1-$2.yaml
  {
    echo "name: comm-$1-$2"
    echo "model: mlp_wide"
    echo "mode: $1"
    echo "data: {format: idx, limit_train: $COMM_LIMIT}"
    echo "optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}"
    echo "consistency: sync"
    echo "workers: 2"
    [ "$1" = ps ] && echo "shards: 2"
    echo "wire_dtype: $2"
    echo "epochs: 1"
    echo "batch_size: 64"
    echo "log_every_steps: 50"
    [ -n "${COMM_CHUNK_BYTES:-}" ] && echo "chunk_bytes: $COMM_CHUNK_BYTES"
  } >"$f"
  echo "$f"
}

# -> "samples_per_s accuracy seconds lo_bytes"
comm_ours() {
  local before; before=$(lo_bytes)
  local r; r=$(pstrain_once "$(comm_spec "$1" "$2")")
  echo "$r $(( $(lo_bytes) - before ))"
}

comm_ddp() {
  local before; before=$(lo_bytes)
  local r
  r=$($PY bench/torch_ddp_train.py --workers 2 --epochs 1 --batch 64 --lr 0.05 --threads 1 --model mlp_wide \
        --hook "$1" --limit-train "$COMM_LIMIT" 2>"$WORK/ddp.log" | tail -1 \
      | $PY -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r["samples_per_s"], r["accuracy"], r["seconds"])') \
    || { tail -5 "$WORK/ddp.log" >&2; echo "0 0 0 0"; return; }
  echo "$r $(( $(lo_bytes) - before ))"
}

comm() {
  local reps=${1:-3}
  COMM_LIMIT=${COMM_LIMIT:-30000}
  # The link: on one machine every "node" talks over loopback, where a byte
  # costs a memory copy, not network time. COMM_LINK (default 10gbit, a
  # common datacenter NIC) shapes the loopback interface with a token bucket
  # (tc tbf) for the runs, shared by every connection of the run (so all
  # traffic of all workers and shards shares one such link: conservative);
  # COMM_LINK=none measures plain loopback. Needs root; removed on exit.
  COMM_LINK=${COMM_LINK:-10gbit}
  if [ "$COMM_LINK" != none ]; then
    tc qdisc add dev lo root tbf rate "$COMM_LINK" burst 4mb latency 100ms \
      || { echo "cannot shape lo (root and sch_tbf needed); COMM_LINK=none runs unshaped" >&2; exit 1; }
    trap 'tc qdisc del dev lo root 2>/dev/null; cleanup' EXIT INT TERM
  fi
  local steps=$(( (COMM_LIMIT / 2 + 63) / 64 ))
  log "building"
  bazel build //client:pstrain >&2
  declare -A runs
  local variants=(ps_fp32 ps_bf16 allreduce_fp32 allreduce_fp16 ddp ddp_fp16_hook ddp_bf16_hook)
  for r in $(seq "$reps"); do
    for v in "${variants[@]}"; do
      log "rep $r/$reps: $v"
      case $v in
        ps_fp32) runs[$v]+="$(comm_ours ps fp32)"$'\n' ;;
        ps_bf16) runs[$v]+="$(comm_ours ps bf16)"$'\n' ;;
        allreduce_fp32) runs[$v]+="$(comm_ours allreduce fp32)"$'\n' ;;
        allreduce_fp16) runs[$v]+="$(comm_ours allreduce fp16)"$'\n' ;;
        ddp) runs[$v]+="$(comm_ddp none)"$'\n' ;;
        ddp_fp16_hook) runs[$v]+="$(comm_ddp fp16)"$'\n' ;;
        ddp_bf16_hook) runs[$v]+="$(comm_ddp bf16)"$'\n' ;;
      esac
    done
  done
  printf '\n%-18s %12s %10s %10s %14s   (medians of %s runs; mlp_wide 5.8M params, %s images, 2 workers x batch 64, sync, 1 thread each, link %s)\n' \
    "comm" "samples/s" "accuracy" "seconds" "lo MB/step" "$reps" "$COMM_LIMIT" "$COMM_LINK" >&2
  for v in "${variants[@]}"; do
    printf '%-18s %12.0f %10.4f %10.1f %14.1f\n' "$v" "$(col $v 1)" "$(col $v 2)" "$(col $v 3)" \
      "$(echo "$(col $v 4) $steps" | awk '{print $1 / $2 / 1e6}')" >&2
  done
  $PY - <<PYEOF
import json
steps = $steps
row = {v: {"samples_per_s": float(a), "accuracy": float(b), "seconds": float(c), "lo_bytes_per_step": float(d) / steps}
       for v, (a, b, c, d) in {
           "ps_fp32": ("$(col ps_fp32 1)", "$(col ps_fp32 2)", "$(col ps_fp32 3)", "$(col ps_fp32 4)"),
           "ps_bf16": ("$(col ps_bf16 1)", "$(col ps_bf16 2)", "$(col ps_bf16 3)", "$(col ps_bf16 4)"),
           "allreduce_fp32": ("$(col allreduce_fp32 1)", "$(col allreduce_fp32 2)", "$(col allreduce_fp32 3)", "$(col allreduce_fp32 4)"),
           "allreduce_fp16": ("$(col allreduce_fp16 1)", "$(col allreduce_fp16 2)", "$(col allreduce_fp16 3)", "$(col allreduce_fp16 4)"),
           "ddp": ("$(col ddp 1)", "$(col ddp 2)", "$(col ddp 3)", "$(col ddp 4)"),
           "ddp_fp16_hook": ("$(col ddp_fp16_hook 1)", "$(col ddp_fp16_hook 2)", "$(col ddp_fp16_hook 3)", "$(col ddp_fp16_hook 4)"),
           "ddp_bf16_hook": ("$(col ddp_bf16_hook 1)", "$(col ddp_bf16_hook 2)", "$(col ddp_bf16_hook 3)", "$(col ddp_bf16_hook 4)"),
       }.items()}
ratio = lambda a, b: round(a / b, 3) if b else None
print(json.dumps({
    "bench": "comm", "reps": $reps, "steps_per_worker": steps, "link": "$COMM_LINK",
    "setup": "mlp_wide (784-2048-2048-10, 5.8M params), Fashion-MNIST first $COMM_LIMIT images, 2 workers x batch 64, 1 epoch, sync, SGD lr 0.05 momentum 0.9, 1 thread per process; pstrain PS with 2 shards",
    "runs": row,
    "accuracy": {v: r["accuracy"] for v, r in row.items()},
    "ratios": {
        "vs_torch_ddp": ratio(row["ps_bf16"]["samples_per_s"], row["ddp"]["samples_per_s"]),
        "vs_torch_ddp_fp16_hook": ratio(row["ps_bf16"]["samples_per_s"], row["ddp_fp16_hook"]["samples_per_s"]),
        "bytes_bf16_vs_fp32": ratio(row["ps_bf16"]["lo_bytes_per_step"], row["ps_fp32"]["lo_bytes_per_step"]),
        "fp32_vs_torch_ddp": ratio(row["ps_fp32"]["samples_per_s"], row["ddp"]["samples_per_s"]),
        "allreduce_vs_torch_ddp": ratio(row["allreduce_fp32"]["samples_per_s"], row["ddp"]["samples_per_s"]),
        "allreduce_fp16_vs_torch_ddp_fp16_hook": ratio(row["allreduce_fp16"]["samples_per_s"], row["ddp_fp16_hook"]["samples_per_s"]),
    },
}))
PYEOF
}

train() {
  local reps=${1:-3}
  log "building"
  bazel build //client:pstrain >&2
  declare -A runs
  for r in $(seq "$reps"); do
    log "rep $r/$reps: pstrain async (examples/fashion_mnist_async.yaml)"
    runs[async]+="$(pstrain_once examples/fashion_mnist_async.yaml)"$'\n'
    log "rep $r/$reps: pstrain sync (examples/fashion_mnist.yaml, the demo)"
    runs[sync]+="$(pstrain_once examples/fashion_mnist.yaml)"$'\n'
    log "rep $r/$reps: pstrain all-reduce (examples/fashion_mnist_allreduce.yaml)"
    runs[allreduce]+="$(pstrain_once examples/fashion_mnist_allreduce.yaml)"$'\n'
    log "rep $r/$reps: PyTorch DDP (gloo)"
    runs[ddp]+="$(ddp_once)"$'\n'
  done
  pstrain_table train "medians of $reps runs; LeNet, Fashion-MNIST, 2 workers, batch 64, 3 epochs, 1 thread each" "" \
    async sync allreduce ddp
  $PY - <<PYEOF
import json
a, s, ar, d = $(col async 1), $(col sync 1), $(col allreduce 1), $(col ddp 1)
print(json.dumps({
    "bench": "train", "reps": $reps,
    "setup": "LeNet-5, Fashion-MNIST, 2 workers x batch 64, 3 epochs, SGD lr 0.05 momentum 0.9 cosine, 1 thread per process",
    "ours_async_samples_per_s": a, "ours_sync_samples_per_s": s, "ours_allreduce_samples_per_s": ar,
    "torch_ddp_samples_per_s": d,
    "ours_async_accuracy": $(col async 2), "ours_sync_accuracy": $(col sync 2),
    "ours_allreduce_accuracy": $(col allreduce 2),
    "torch_ddp_accuracy": $(col ddp 2),
    "accuracy": $(col async 2),
    "ratios": {"vs_torch_ddp": round(a / d, 3), "sync_vs_torch_ddp": round(s / d, 3),
               "allreduce_vs_torch_ddp": round(ar / d, 3)},
}))
PYEOF
}

# The comm benchmark with one network per "host": every process in a network
# namespace of its own (a veth pair onto a bridge), each veth shaped in both
# directions to COMM_LINK (default 1gbit): a full-duplex NIC per host, as in
# a cluster, where `comm` shares one shaped loopback among all. pstrain PS
# (coordinator, 2 shards, 2 workers: 5 hosts) with fp32 and bf16 wire, and
# PyTorch DDP (2 ranks: 2 hosts) without a hook and with fp16_compress_hook,
# same model, data, batch, threads. Needs root (ip netns, tc).
commhosts() {
  local reps=${1:-3}
  COMM_LIMIT=${COMM_LIMIT:-16000}
  COMM_LINK=${COMM_LINK:-1gbit}
  # Globals: the EXIT trap (outside this function) removes them.
  NS_TAG=pscb NS_BR=pscbbr NS_HOSTS=(coord ps0 ps1 w0 w1) NS_PIDS=()
  local tag=$NS_TAG net=10.213.7 br=$NS_BR
  local hosts=("${NS_HOSTS[@]}")
  declare -A ip=([coord]=$net.2 [ps0]=$net.3 [ps1]=$net.4 [w0]=$net.5 [w1]=$net.6)
  netclean() {
    for p in "${NS_PIDS[@]:-}"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null || true; done
    for p in "${NS_PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
    for h in "${NS_HOSTS[@]}"; do ip netns del "$NS_TAG-$h" 2>/dev/null || true; done
    ip link del "$NS_BR" 2>/dev/null || true
    cleanup
  }
  trap netclean EXIT INT TERM
  log "building"
  bazel build //client:pstrain //server/coordinator:pstrain-coordinator //server/ps:pstrain-ps \
    //worker:pstrain-worker >&2
  source deploy/pods/netns.sh
  netns_bridge "$br" "$net.1" || { echo "cannot create a bridge (root needed)" >&2; exit 1; }
  local i=0
  for h in "${hosts[@]}"; do
    netns_host "$tag-$h" "${tag}v$i" "$br" "${ip[$h]}"
    # The host's NIC: COMM_LINK each way.
    tc qdisc add dev "${tag}v$i" root tbf rate "$COMM_LINK" burst 1mb latency 100ms
    ip netns exec "$tag-$h" tc qdisc add dev eth0 root tbf rate "$COMM_LINK" burst 1mb latency 100ms
    i=$((i + 1))
  done
  local bin=$PWD/bazel-bin coord=${ip[coord]}:7000
  # exec: a server started with `inns ... &` is then $! itself (killable).
  inns() { local h=$1; shift; exec ip netns exec "$NS_TAG-$h" "$@"; }
  inns coord "$bin/server/coordinator/pstrain-coordinator" --host=0.0.0.0 --port=7000 --db="$WORK/jobs.db" \
    --checkpoint_root="$WORK/out" >"$WORK/coord.log" 2>&1 &
  NS_PIDS+=($!)
  for s in 0 1; do
    inns "ps$s" "$bin/server/ps/pstrain-ps" --host=0.0.0.0 --port=7070 --advertise_host="${ip[ps$s]}" \
      --coordinator="$coord" --name="shard-$s" --shard_index="$s" --num_shards=2 --checkpoint_root="$WORK/out" \
      >"$WORK/ps$s.log" 2>&1 &
    NS_PIDS+=($!)
  done
  for w in 0 1; do
    inns "w$w" "$bin/worker/pstrain-worker" --coordinator="$coord" --name="worker-$w" --data_root="$DATA_ROOT" \
      >"$WORK/w$w.log" 2>&1 &
    NS_PIDS+=($!)
  done
  local cli=("$bin/client/pstrain" --coordinator "$coord")
  for _ in $(seq 100); do "${cli[@]}" cluster 2>/dev/null | grep -c alive | grep -q 4 && break; sleep 0.2; done
  ours_hosts() {  # ours_hosts WIRE -> "samples_per_s accuracy seconds"
    local spec; spec=$(comm_spec ps "$1")
    local job; job=$("${cli[@]}" submit "$spec" --output_dir "$WORK/out/c" | grep -o 'job-[0-9]*' | head -1)
    "${cli[@]}" watch "$job" >"$WORK/$job.log" 2>&1 || { tail -5 "$WORK/$job.log" >&2; echo "0 0 0"; return; }
    sed -n 's/^done: \([0-9.]*\) s, \([0-9.]*\) samples\/s, final test accuracy \([0-9.]*\).*/\2 \3 \1/p' "$WORK/$job.log"
  }
  ddp_hosts() {  # ddp_hosts HOOK -> "samples_per_s accuracy seconds"
    local port=$((29500 + RANDOM % 1000)) r ranks=()
    for r in 0 1; do
      inns "w$r" env GLOO_SOCKET_IFNAME=eth0 $PY bench/torch_ddp_train.py --workers 2 --rank "$r" \
        --master-addr "${ip[w0]}" --master-port "$port" --epochs 1 --batch 64 --lr 0.05 --threads 1 \
        --model mlp_wide --hook "$1" --limit-train "$COMM_LIMIT" >"$WORK/ddp$r.json" 2>"$WORK/ddp$r.log" &
      ranks+=($!)
    done
    wait "${ranks[@]}" 2>/dev/null
    $PY - "$WORK/ddp0.json" "$WORK/ddp1.json" <<'PYEOF' || echo "0 0 0"
import json, sys
rows = [json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[1:]]
seconds = max(r["seconds"] for r in rows)
print(sum(r["samples"] for r in rows) / seconds, rows[0]["accuracy"], seconds)
PYEOF
  }
  declare -A runs
  local variants=(ps_fp32 ps_bf16 ddp ddp_fp16_hook)
  for r in $(seq "$reps"); do
    for v in "${variants[@]}"; do
      log "rep $r/$reps: $v (one $COMM_LINK link per host)"
      case $v in
        ps_fp32) runs[$v]+="$(ours_hosts fp32)"$'\n' ;;
        ps_bf16) runs[$v]+="$(ours_hosts bf16)"$'\n' ;;
        ddp) runs[$v]+="$(ddp_hosts none)"$'\n' ;;
        ddp_fp16_hook) runs[$v]+="$(ddp_hosts fp16)"$'\n' ;;
      esac
    done
  done
  printf '\n%-18s %12s %10s %10s   (medians of %s runs; mlp_wide, %s images, 2 workers x batch 64, sync, 1 thread each, one %s link per host)\n' \
    "commhosts" "samples/s" "accuracy" "seconds" "$reps" "$COMM_LIMIT" "$COMM_LINK" >&2
  for v in "${variants[@]}"; do
    printf '%-18s %12.0f %10.4f %10.1f\n' "$v" "$(col "$v" 1)" "$(col "$v" 2)" "$(col "$v" 3)" >&2
  done
  $PY - <<PYEOF
import json
b, f, d, h = $(col ps_bf16 1), $(col ps_fp32 1), $(col ddp 1), $(col ddp_fp16_hook 1)
print(json.dumps({
    "bench": "commhosts", "reps": $reps, "link_per_host": "$COMM_LINK",
    "setup": "mlp_wide 5.8M params, $COMM_LIMIT Fashion-MNIST images, 2 workers x batch 64, sync, 1 thread; pstrain PS on 2 shards",
    "samples_per_s": {"ps_fp32": f, "ps_bf16": b, "torch_ddp": d, "torch_ddp_fp16_hook": h},
    "accuracy": {"ps_bf16": $(col ps_bf16 2), "torch_ddp": $(col ddp 2)},
    "ratios": {"vs_torch_ddp": round(b / d, 3) if d else 0, "vs_torch_ddp_fp16_hook": round(b / h, 3) if h else 0,
               "ps_bf16_vs_fp32": round(b / f, 3) if f else 0},
}))
PYEOF
}

# The TensorBoard writer's cost: the demo job with the coordinator writing
# event files and without (PSTRAIN_TENSORBOARD=false reaches its
# --tensorboard), runs alternated.
telemetry() {
  local reps=${1:-5}
  log "building"
  bazel build //client:pstrain >&2
  declare -A runs
  for r in $(seq "$reps"); do
    log "rep $r/$reps: demo job, event files on"
    runs[on]+="$(PSTRAIN_TENSORBOARD=true pstrain_once examples/fashion_mnist.yaml)"$'\n'
    log "rep $r/$reps: demo job, event files off"
    runs[off]+="$(PSTRAIN_TENSORBOARD=false pstrain_once examples/fashion_mnist.yaml)"$'\n'
  done
  pstrain_table telemetry "medians of $reps runs, alternated; examples/fashion_mnist.yaml" "event files " on off
  $PY - <<PYEOF
import json
on, off = $(col on 1), $(col off 1)
print(json.dumps({
    "bench": "telemetry", "reps": $reps,
    "setup": "the demo job (LeNet-5, Fashion-MNIST, 2 shards, 2 workers, async, 3 epochs) via pstrain local",
    "samples_per_s_event_files_on": on, "samples_per_s_event_files_off": off,
    "ratios": {"on_vs_off": round(on / off, 4)},
}))
PYEOF
}

# One all-reduce run of N pstrain ranks -> its JSON line.
ours_allreduce_once() {  # ours_allreduce_once WORLD
  local world=$1 port pids=() out=$WORK/ar.$RANDOM
  port=$(free_port)
  for r in $(seq 0 $((world - 1))); do
    $BIN/bench/allreduce_bench --rank="$r" --world="$world" --port="$port" --sizes="$AR_SIZES" \
      --seconds_per_size="$AR_SECONDS" >"$out.$r" 2>"$out.$r.log" &
    pids+=($!); PIDS+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { cat "$out".*.log >&2; exit 1; }; done
  tail -1 "$out.0"
}

torch_allreduce_once() {  # torch_allreduce_once WORLD
  $PY bench/torch_allreduce.py --world "$1" --port "$(free_port)" --sizes "$AR_SIZES" \
    --seconds-per-size "$AR_SECONDS" 2>"$WORK/torch_ar.log" | tail -1
}

AR_SIZES=4096,1048576,16777216,67108864,268435456
AR_SECONDS=${AR_SECONDS:-1.5}

allreduce() {
  local reps=${1:-3}
  log "building"
  bazel build //bench:allreduce_bench >&2
  local results=$WORK/allreduce.jsonl
  : >"$results"
  for r in $(seq "$reps"); do
    for world in 2 4; do
      log "rep $r/$reps: pstrain gloo, $world ranks"
      echo "{\"who\": \"ours\", \"world\": $world, \"run\": $(ours_allreduce_once "$world")}" >>"$results"
      log "rep $r/$reps: torch.distributed gloo, $world ranks"
      echo "{\"who\": \"torch\", \"world\": $world, \"run\": $(torch_allreduce_once "$world")}" >>"$results"
    done
  done
  $PY - "$results" "$reps" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
reps = int(sys.argv[2])
table, ratios, min_ratio = {}, {}, None
for world in (2, 4):
    for who in ("ours", "torch"):
        runs = [r["run"] for r in rows if r["who"] == who and r["world"] == world]
        sizes = runs[0]["sizes"]
        for i, size in enumerate(sizes):
            t = statistics.median(run["seconds"][i] for run in runs)
            busbw = size * 2 * (world - 1) / world / t / 1e9
            table[(world, who, size)] = (t, busbw)
print(f"\n{'all-reduce float32':<20} {'ranks':>5} {'ours ms':>10} {'torch ms':>10} {'ours GB/s':>10} {'torch GB/s':>11} {'ratio':>7}"
      f"   (bus bandwidth = size x 2(n-1)/n / time; medians of {reps} runs)", file=sys.stderr)
out_sizes = {}
for world in (2, 4):
    for size in sorted({k[2] for k in table if k[0] == world}):
        (to, bo), (tt, bt) = table[(world, "ours", size)], table[(world, "torch", size)]
        ratio = bo / bt
        label = f"{size // 1024} KB" if size < (1 << 20) else f"{size >> 20} MB"
        print(f"{label:<20} {world:>5} {to * 1e3:>10.3f} {tt * 1e3:>10.3f} {bo:>10.3f} {bt:>11.3f} {ratio:>7.3f}",
              file=sys.stderr)
        out_sizes[f"{world}x{size}"] = {"ours_ms": round(to * 1e3, 4), "torch_ms": round(tt * 1e3, 4),
                                        "ours_busbw_gb_per_s": round(bo, 4), "torch_busbw_gb_per_s": round(bt, 4),
                                        "ratio": round(ratio, 3)}
        if size >= (1 << 20):
            min_ratio = ratio if min_ratio is None else min(min_ratio, ratio)
print(json.dumps({"bench": "allreduce", "reps": reps,
                  "setup": "float32, ranks as processes on 127.0.0.1, gloo both sides, 1 compute thread each",
                  "results": out_sizes, "ratios": {"vs_torch_gloo_busbw_min": round(min_ratio, 3)}}))
PYEOF
}


# The GPU benchmark. pstrain's samples/s come from the workers' progress
# events after the first window (cuDNN's autotuning and the first
# allocations excluded, as the peer's warm-up steps are). No evaluation
# while training (the peer does none; with one, rank 0 stopped to pull and
# evaluate after each of the 3 to 6 epochs the 200 steps span).
#
# Each run also gives the workers' own account of a step, from the same
# windows (milliseconds, mean over workers): the step as the host lived it,
# the part it waited for the exchange after backward, and for data. Where
# the device keeps the host waiting, it shows there.
gpu_ours_once() {  # gpu_ours_once ps|allreduce MODEL -> "samples/s step_ms wait_ms data_ms"
  local mode=$1 model=$2 run=$WORK/gpu.$RANDOM steps=${GPU_STEPS:-200} batch=${GPU_BATCH:-256}
  mkdir -p "$run"
  local workers=2 shards=${GPU_SHARDS:-2}
  [ "$mode" = allreduce ] && { workers=1; shards=0; }
  cat >"$run/job.yaml" <<YAML
name: gpu-$mode
model: torchscript:$(basename "$model")
data: {format: synthetic, synthetic_train: 16384, synthetic_test: 256}
optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}
mode: $mode
device: ${GPU_DEVICE:-cuda}
precision: ${GPU_PRECISION:-fp32}
wire_dtype: $([ "$mode" = ps ] && echo "${GPU_WIRE:-fp32}" || echo fp32)
requests_in_flight: ${GPU_REQUESTS_IN_FLIGHT:-2}
backend: $([ "${GPU_DEVICE:-cuda}" = cpu ] && echo gloo || echo nccl)
consistency: $([ "$mode" = ps ] && echo async || echo sync)
workers: $workers
shards: $shards
epochs: 100
max_steps: $steps
batch_size: $batch
threads_per_worker: ${GPU_THREADS:-4}
clip_grad_norm: ${GPU_CLIP:-0}
log_every_steps: 20
eval_every_epochs: 0
output_dir: $run/out
YAML
  [ "$mode" = ps ] && sed -i '/^backend:/d' "$run/job.yaml"
  local targets="" pids=()
  for i in $(seq 0 $((shards - 1))); do
    $BIN/server/ps/pstrain-ps --host=127.0.0.1 --port=0 --port_file="$run/s$i" --shard_index=$i \
      --num_shards=$shards --checkpoint_root="$run" >"$run/s$i.log" 2>&1 &
    pids+=($!); PIDS+=($!)
  done
  for i in $(seq 0 $((shards - 1))); do wait_file "$run/s$i" 30; targets+="${targets:+,}$(head -1 "$run/s$i")"; done
  local wpids=() port; port=$(free_port)
  for w in $(seq 0 $((workers - 1))); do
    RANK=$w WORLD_SIZE=$workers LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      $BIN/worker/pstrain-worker --spec="$run/job.yaml" --rank=$w --world_size=$workers --shards="$targets" \
        --data_root="$(dirname "$model")" \
      >"$run/w$w.jsonl" 2>"$run/w$w.log" &
    wpids+=($!)
  done
  for p in "${wpids[@]}"; do wait "$p" || { tail -20 "$run"/w*.log >&2; exit 1; }; done
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  $PY - "$batch" "$run"/w*.jsonl <<'PYEOF'
import json, sys
batch, total, host = int(sys.argv[1]), 0.0, [0.0, 0.0, 0.0]
for path in sys.argv[2:]:
    rows = [json.loads(l)["progress"] for l in open(path) if '"progress"' in l]
    first, last = rows[0], rows[-1]
    total += (int(last["step"]) - int(first["step"])) * batch / (last["elapsed_s"] - first["elapsed_s"])
    for k, key in enumerate(("step_time_s", "exchange_wait_s", "data_wait_s")):
        host[k] += sum(r.get(key, 0) for r in rows[1:]) / max(1, len(rows) - 1) * 1e3 / (len(sys.argv) - 2)
print(total, *(round(h, 3) for h in host))
PYEOF
}

gpu_torch_once() {  # gpu_torch_once DDP(0|1) MODEL -> samples/s
  $PY bench/torch_gpu_train.py train --model "$2" --ddp "$1" --port "$(free_port)" \
    --steps "${GPU_STEPS:-200}" --batch "${GPU_BATCH:-256}" --precision "${GPU_PRECISION:-fp32}" \
    --device "${GPU_DEVICE:-cuda}" --threads "${GPU_THREADS:-4}" 2>"$WORK/torch_gpu.log" \
    | tail -1 | $PY -c 'import json,sys; print(json.loads(sys.stdin.read())["samples_per_s"])' \
    || { cat "$WORK/torch_gpu.log" >&2; exit 1; }
}

gpu() {
  local reps=${1:-3} model=$WORK/resnet18.pt lines=" ${GPU_LINES:-ps ar torch ddp} " be=nccl
  [ "${GPU_DEVICE:-cuda}" = cpu ] && be=gloo  # the CPU's analogue (GPU_DEVICE=cpu): gloo both sides
  $PY bench/torch_gpu_train.py model "$model"
  declare -A runs
  for r in $(seq "$reps"); do
    [[ $lines == *" ps "* ]] && { log "rep $r/$reps: pstrain ps (2 workers, 1 GPU)"; runs[ps]+="$(gpu_ours_once ps "$model")"$'\n'; }
    [[ $lines == *" ar "* ]] && { log "rep $r/$reps: pstrain all-reduce ($be, 1 rank)"; runs[ar]+="$(gpu_ours_once allreduce "$model")"$'\n'; }
    [[ $lines == *" torch "* ]] && { log "rep $r/$reps: torch (one process)"; runs[torch]+="$(gpu_torch_once 0 "$model")"$'\n'; }
    [[ $lines == *" ddp "* ]] && { log "rep $r/$reps: torch DDP ($be, 1 rank)"; runs[ddp]+="$(gpu_torch_once 1 "$model")"$'\n'; }
  done
  # A line left out (GPU_LINES) is 0 (col's median of nothing), and so are
  # the ratios it is part of.
  printf '\n%-36s %12s   (ResNet-18, 1x28x28, batch %s, %s, %s, medians of %s runs)\n' "GPU training" "samples/s" \
    "${GPU_BATCH:-256}" "${GPU_PRECISION:-fp32}" "${GPU_DEVICE:-cuda}" "$reps" >&2
  printf '%-36s %12.0f\n' "pstrain ps, 2 workers" "$(col ps)" "pstrain all-reduce, $be, 1 rank" "$(col ar)" \
    "torch, one process" "$(col torch)" "torch DDP, $be, 1 rank" "$(col ddp)" >&2
  printf '%-36s %12s %12s %12s\n' "pstrain, per step (host)" "step ms" "exchange ms" "data ms" >&2
  printf '%-36s %12.3f %12.3f %12.3f\n' "ps (each worker)" "$(col ps 2)" "$(col ps 3)" "$(col ps 4)" \
    "all-reduce" "$(col ar 2)" "$(col ar 3)" "$(col ar 4)" >&2
  $PY - <<PYEOF
import json
ps, ar, torch1, ddp = $(col ps), $(col ar), $(col torch), $(col ddp)
ratio = lambda a, b: round(a / b, 3) if a and b else 0
print(json.dumps({"bench": "gpu", "reps": $reps, "precision": "${GPU_PRECISION:-fp32}", "wire_dtype": "${GPU_WIRE:-fp32}",
                  "ps_shards": ${GPU_SHARDS:-2}, "ps_requests_in_flight": ${GPU_REQUESTS_IN_FLIGHT:-2},
                  "device": "${GPU_DEVICE:-cuda}",
                  "setup": "ResNet-18 (11.2M params), synthetic 1x28x28, batch ${GPU_BATCH:-256}, SGD momentum, one ${GPU_DEVICE:-cuda} device",
                  "samples_per_s": {"pstrain_ps_2_workers": round(ps), "pstrain_allreduce_${be}_1": round(ar),
                                    "torch_one_process": round(torch1), "torch_ddp_${be}_1": round(ddp)},
                  "host_ms_per_step": {line: dict(zip(("step", "exchange_wait", "data_wait"), vals)) for line, vals in
                                       (("ps", ($(col ps 2), $(col ps 3), $(col ps 4))),
                                        ("allreduce", ($(col ar 2), $(col ar 3), $(col ar 4))))},
                  "ratios": {"allreduce_vs_torch_ddp": ratio(ar, ddp), "ps_vs_torch_one_process": ratio(ps, torch1)}}))
PYEOF
}

# The figures elastic_test prints, REPS runs of it (real processes: a
# coordinator, a shard, three workers and a spare; leases of 0.5 s).
elastic() {
  local reps=${1:-5} out=$WORK/elastic.out
  ${BAZEL:-bazel} test //tests:elastic_test --runs_per_test="$reps" --nocache_test_results --test_output=all \
    --test_arg=--gtest_filter='*Spare*:*Comparison*' >"$out" 2>&1 || { tail -40 "$out" >&2; exit 1; }
  num() { grep -E "^$1: .*$2 [0-9.]+ s" "$out" | sed -E "s/.*$2 ([0-9.]+) s.*/\1/" | median; }
  local sync_step async_step sync_spare async_spare restart
  sync_step=$(num sync "more steps"); async_step=$(num async "more steps")
  sync_spare=$(num sync "spare admitted"); async_spare=$(num async "spare admitted")
  restart=$(num restart "step \\+ 5")
  printf '\n%-52s %10s   (medians of %s runs; lease 0.5 s)\n' "a worker of 3 SIGKILLed" "seconds" "$reps" >&2
  printf '%-52s %10.2f\n' "sync: survivors 5 steps further" "$sync_step" "async: survivors 5 steps further" "$async_step" \
    "sync: spare admitted (started 2 s after the kill)" "$sync_spare" \
    "async: spare admitted (started 2 s after the kill)" "$async_spare" \
    "before: restart from the checkpoint, back past it" "$restart" >&2
  printf '{"bench": "elastic", "reps": %s, "setup": "ps mode, 3 workers, 1 shard, mlp, batch 16, lease 0.5 s, spare started 2 s after the SIGKILL", "seconds": {"sync_survivors_next_steps": %s, "async_survivors_next_steps": %s, "sync_spare_admitted": %s, "async_spare_admitted": %s, "restart_from_checkpoint_back_to_pre_kill_step": %s}, "ratios": {"restart_vs_sync_survivors": %.1f}}\n' \
    "$reps" "$sync_step" "$async_step" "$sync_spare" "$async_spare" "$restart" \
    "$(awk -v a="$restart" -v b="$sync_step" 'BEGIN {print a / b}')"
}

# A shard SIGKILLed in a 3-shard job with replicas: 1 (tests/replication_test):
# how long until the job is 5 steps further, with no restart.
replication() {
  local reps=${1:-5} out=$WORK/replication.out
  ${BAZEL:-bazel} test //tests:replication_test --runs_per_test="$reps" --nocache_test_results --test_output=all \
    --test_arg=--gtest_filter='*LosesAShard*' >"$out" 2>&1 || { tail -40 "$out" >&2; exit 1; }
  num() { grep -E "^$1: .*$2 [0-9.]+ s" "$out" | sed -E "s/.*$2 ([0-9.]+) s.*/\1/" | median; }
  local sync_step async_step bitwise ctr_sync ctr_async
  sync_step=$(num sync "more steps"); async_step=$(num async "more steps")
  ctr_sync=$(num "ctr sync" "more steps"); ctr_async=$(num "ctr async" "more steps")
  bitwise=$(grep -c "bitwise equal to the uninterrupted run: yes" "$out" || true)
  printf '\n%-52s %10s   (medians of %s runs; lease 0.5 s)\n' "a shard of 3 SIGKILLed, replicas: 1" "seconds" "$reps" >&2
  printf '%-52s %10.2f\n' "sync: 5 steps further" "$sync_step" "async: 5 steps further" "$async_step" \
    "dlrm with embeddings, sync: 5 steps further" "$ctr_sync" "dlrm with embeddings, async: 5 steps further" "$ctr_async" >&2
  printf '%-52s %10s\n' "sync runs bitwise equal to the uninterrupted one" "$bitwise of $reps" >&2
  printf '{"bench": "replication", "reps": %s, "setup": "ps mode, 2 workers, 3 shards, replicas 1, mlp, batch 16, chunk_bytes 16384; dlrm: 26 tables of dim 8, batch 64; lease 0.5 s", "seconds": {"sync_sigkill_to_5_more_steps": %s, "async_sigkill_to_5_more_steps": %s, "dlrm_sync_sigkill_to_5_more_steps": %s, "dlrm_async_sigkill_to_5_more_steps": %s}, "sync_runs_bitwise_equal_to_uninterrupted": %s}\n' \
    "$reps" "$sync_step" "$async_step" "$ctr_sync" "$ctr_async" "$bitwise"
}

source bench/embeddings.sh
source bench/pipeline.sh

# bench/run.sh quantize (bench/quantize_bench.py measures; this trains and exports).
quantize_spec() {  # quantize_spec MODEL qat|fp32 -> a spec file: 1 worker, 1 shard, 3 epochs
  local f=$WORK/$1-$2.yaml
  {
    echo "name: quantize-$1-$2"
    echo "model: $1"
    echo "data: {format: idx, dir: fashion-mnist}"
    echo "optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}"
    echo "lr_schedule: {kind: cosine}"
    echo "mode: ps"
    echo "workers: 1"
    echo "shards: 1"
    echo "epochs: 3"
    echo "batch_size: 64"
    echo "seed: 42"
    [ "$2" = qat ] && echo "quantization: {mode: qat, start_step: 500}"
  } >"$f"
  echo "$f"
}

embckpt() {
  bazel build //bench:embedding_checkpoint_bench >&2
  "$BIN/bench/embedding_checkpoint_bench" --dir="$WORK/embckpt" --reps="${1:-3}" \
    --rows="${EMBCKPT_ROWS:-2000000}"
}

quantize() {
  log "building"
  bazel build //client:pstrain //quantize:pstrain-quantize >&2
  $PY tests/quantize_models.py calibration "$WORK"
  local args=() model kind out w
  for model in mlp lenet; do
    for kind in fp32 qat; do
      out=$WORK/train-$model-$kind
      log "training $model ($kind)"
      "$BIN/client/pstrain" local "$(quantize_spec $model $kind)" --output_dir "$out" --data_root "$DATA_ROOT" \
        >"$out.log" 2>&1 || { cat "$out.log" >&2; exit 1; }
      w=$(sed -n 's/^weights: //p' "$out.log")
      if [ $kind = qat ]; then
        log "converting the QAT $model with its learned scales"
        "$BIN/quantize/pstrain-quantize" $model "$w" "$WORK/$model-qat.pt" static >&2
        continue
      fi
      log "exporting $model in int8 (dynamic, static)"
      "$BIN/quantize/pstrain-quantize" $model "$w" "$WORK/$model-dynamic.pt" dynamic >&2
      "$BIN/quantize/pstrain-quantize" $model "$w" "$WORK/$model-dynamic-pt.pt" dynamic --per_tensor >&2
      "$BIN/quantize/pstrain-quantize" $model "$w" "$WORK/$model-static.pt" static \
        --calibration "$WORK/calibration.pt" >&2
      args+=("$model=$w")
    done
  done
  log "measuring ours and PyTorch's (PyTorch's QAT fine-tunes one epoch)"
  $PY bench/quantize_bench.py "$WORK" "${args[@]}"
}

case "${1:-}" in
  embeddings) shift; embeddings "$@" ;;
  elastic) shift; elastic "$@" ;;
  gpu) shift; gpu "$@" ;;
  pushpull) shift; pushpull "$@" ;;
  replication) shift; replication "$@" ;;
  comm) shift; comm "$@" ;;
  train) shift; train "$@" ;;
  telemetry) shift; telemetry "$@" ;;
  commhosts) shift; commhosts "$@" ;;
  allreduce) shift; allreduce "$@" ;;
  quantize) shift; quantize "$@" ;;
  embckpt) shift; embckpt "$@" ;;
  pipeline) shift; pipeline "$@" ;;
  *) echo "usage: bench/run.sh pushpull|replication|train|comm|commhosts|allreduce|gpu|elastic|telemetry|embeddings|quantize|pipeline [REPS]" >&2; exit 2 ;;
esac
