#!/usr/bin/env bash
# Pods on one machine: the Kubernetes topology for real, without a cluster.
# The coordinator, 2 parameter shards and 2 workers each run in a network
# namespace of their own (a veth pair onto one bridge, an address each), with
# the pod's host name (a UTS namespace: pstrain-ps-1, pstrain-worker-0, ...)
# and a hosts file that resolves the Service names the way cluster DNS
# would. They are configured through PSTRAIN_* variables, as the manifests
# configure them. From the host namespace the CLI submits a job and sees it
# succeed; then one worker's link is cut mid-run: the job's status reports
# the lost member and the job is requeued from its checkpoint; the link
# comes back and the job finishes. Last, the same cut in a job that may go
# on with fewer workers (min_workers: 1): it keeps training, the returning
# worker is stopped and takes its rank back under a new generation, and the
# job finishes without a restart.
#
# Secured as the manifests secure it: every gRPC connection is mutual TLS
# (one CA, a certificate for the Service names, made by `pstrain
# credentials`), every call carries a token (each member its role's token,
# the CLI a user's; shards make tables only with the coordinator's signed
# grants), the probes use the plaintext health port. The test also checks that
# a client without a certificate, a token, or with the wrong token is
# refused.
#
# Needs root (ip netns, veth, bridge) and the built binaries (bazel-bin).
# usage: deploy/pods/test_pods.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/pods/netns.sh
BIN=$PWD/bazel-bin
# The test needs to create network namespaces, veth pairs, a bridge and UTS
# namespaces; where it may not (not root, a container without
# CAP_NET_ADMIN/CAP_SYS_ADMIN) it says so and skips.
probe=pstprobe$$
if [ "$(id -u)" -ne 0 ] || ! ip netns add "$probe" 2>/dev/null; then
  echo "pods test: SKIPPED: cannot create network namespaces here (needs root with CAP_NET_ADMIN and iproute2)"
  exit 0
fi
if ! ip link add "${probe}b" type bridge 2>/dev/null || ! ip netns exec "$probe" unshare --uts true 2>/dev/null; then
  ip link del "${probe}b" 2>/dev/null || true
  ip netns del "$probe"
  echo "pods test: SKIPPED: cannot create a bridge or a UTS namespace here (needs CAP_NET_ADMIN and CAP_SYS_ADMIN)"
  exit 0
fi
ip link del "${probe}b"
ip netns del "$probe"
for b in server/coordinator/pstrain-coordinator server/ps/pstrain-ps worker/pstrain-worker client/pstrain; do
  [ -x "$BIN/$b" ] || { echo "test_pods: $BIN/$b is not built (bazel build //...)"; exit 2; }
done

TAG=p$(( $$ % 10000 ))          # unique per run: interface names stay < 16 chars
NET=10.$(( 100 + $$ % 100 )).$(( $$ / 100 % 200 + 20 ))
BR=${TAG}br
WORK=$(mktemp -d /tmp/pstrain-pods.XXXXXX)
PODS=(pstrain-coordinator pstrain-ps-0 pstrain-ps-1 pstrain-worker-0 pstrain-worker-1)
declare -A IP=([pstrain-coordinator]=$NET.2 [pstrain-ps-0]=$NET.3 [pstrain-ps-1]=$NET.4
               [pstrain-worker-0]=$NET.5 [pstrain-worker-1]=$NET.6)
declare -A VETH PID
PASS=0

log() { echo "[pods] $*"; }
cleanup() {
  # SIGINT stops each server at once; what is left after 5 s is killed.
  for p in "${PID[@]:-}"; do [ -n "$p" ] && kill -INT "$p" 2>/dev/null || true; done
  for _ in $(seq 50); do
    alive=0
    for p in "${PID[@]:-}"; do [ -n "$p" ] && kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for p in "${PID[@]:-}"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for pod in "${PODS[@]}"; do
    ip netns del "$TAG-$pod" 2>/dev/null || true
    rm -rf "/etc/netns/$TAG-$pod"
  done
  ip link del "$BR" 2>/dev/null || true
  if [ $PASS -eq 1 ]; then rm -rf "$WORK"; else echo "[pods] logs kept in $WORK"; fi
}
trap cleanup EXIT INT TERM

# The network: a bridge (the host is $NET.1 on it), one namespace per pod.
netns_bridge "$BR" "$NET.1"
HOSTS="127.0.0.1 localhost
$NET.2 pstrain-coordinator pstrain-coordinator.pstrain.svc.cluster.local
$NET.3 pstrain-ps-0.pstrain-ps pstrain-ps-0.pstrain-ps.pstrain.svc pstrain-ps-0.pstrain-ps.pstrain.svc.cluster.local
$NET.4 pstrain-ps-1.pstrain-ps pstrain-ps-1.pstrain-ps.pstrain.svc pstrain-ps-1.pstrain-ps.pstrain.svc.cluster.local
$NET.5 pstrain-worker-0.pstrain-worker pstrain-worker-0.pstrain-worker.pstrain.svc.cluster.local
$NET.6 pstrain-worker-1.pstrain-worker pstrain-worker-1.pstrain-worker.pstrain.svc.cluster.local"
i=0
for pod in "${PODS[@]}"; do
  ns=$TAG-$pod
  VETH[$pod]=${TAG}v$i
  netns_host "$ns" "${VETH[$pod]}" "$BR" "${IP[$pod]}"
  ip -n "$ns" route add default via "$NET.1"
  # `ip netns exec` bind-mounts /etc/netns/<ns>/hosts over /etc/hosts.
  mkdir -p "/etc/netns/$ns"
  echo "$HOSTS
${IP[$pod]} $pod" >"/etc/netns/$ns/hosts"
  i=$((i + 1))
done

# A pod: its namespace, its host name, the manifests' environment.
start_pod() {  # start_pod POD BINARY VAR=VALUE...
  local pod=$1 binary=$2; shift 2
  ip netns exec "$TAG-$pod" unshare --uts sh -c 'hostname "$0"; cd "$1"; shift; exec env "$@"' \
    "$pod" "$WORK" "$@" "$BIN/$binary" >"$WORK/$pod.log" 2>&1 &
  PID[$pod]=$!
}
# gRPC's default resolver (c-ares) asks a DNS server before the hosts file;
# these namespaces have no DNS server, so use the system resolver
# (getaddrinfo: the hosts file), which is what a cluster's DNS answers.
# The Secrets: a CA, one certificate for the Service names, the tokens.
C=$WORK/credentials
# (gRPC, like browsers, takes no wildcard over a single label: shards are
# reached at <pod>.pstrain-ps.<namespace>.svc, as in the manifests.)
"$BIN/client/pstrain" credentials --out "$C" --dns 'pstrain-coordinator,*.pstrain-ps.pstrain.svc' --ip '' \
  --user alice >/dev/null
# As the manifests mount them: each pod its own role's token; the shards
# accept the workers' and the coordinator's tokens only; the coordinator
# signs table grants with its key, the shards check them with its public key.
grep -E '"pstrain:(worker|coordinator)"' "$C/tokens.csv" >"$C/shard-tokens.csv"
SEC=(PSTRAIN_TLS_CA="$C/ca.pem" PSTRAIN_TLS_CERT="$C/member.pem" PSTRAIN_TLS_KEY="$C/member-key.pem")
COMMON=(GRPC_DNS_RESOLVER=native PSTRAIN_COORDINATOR=pstrain-coordinator:7000 PSTRAIN_METRICS_PORT=9100)
start_pod pstrain-coordinator server/coordinator/pstrain-coordinator GRPC_DNS_RESOLVER=native PSTRAIN_HOST=0.0.0.0 PSTRAIN_PORT=7000 \
  PSTRAIN_DB="$WORK/jobs.db" PSTRAIN_HEARTBEAT_MS=200 PSTRAIN_MISSED_HEARTBEATS=10 PSTRAIN_METRICS_PORT=9100 \
  PSTRAIN_HEALTH_PORT=7001 "${SEC[@]}" PSTRAIN_TLS_CLIENT_AUTH=require PSTRAIN_TOKEN_FILE="$C/coordinator.token" \
  PSTRAIN_TOKEN_AUTH_FILE="$C/tokens.csv" PSTRAIN_TABLE_GRANT_KEY_FILE="$C/table-grant.key"
for s in 0 1; do
  start_pod "pstrain-ps-$s" server/ps/pstrain-ps "${COMMON[@]}" PSTRAIN_NAME="pstrain-ps-$s" \
    PSTRAIN_ADVERTISE_HOST="pstrain-ps-$s.pstrain-ps.pstrain.svc" PSTRAIN_HOST=0.0.0.0 PSTRAIN_PORT=7070 \
    PSTRAIN_HEALTH_PORT=7071 "${SEC[@]}" PSTRAIN_TLS_CLIENT_AUTH=require PSTRAIN_TOKEN_FILE="$C/shard.token" \
    PSTRAIN_TOKEN_AUTH_FILE="$C/shard-tokens.csv" PSTRAIN_TABLE_GRANT_PUBLIC_KEY_FILE="$C/table-grant.pub"
done
for w in 0 1; do
  start_pod "pstrain-worker-$w" worker/pstrain-worker "${COMMON[@]}" PSTRAIN_NAME="pstrain-worker-$w" \
    PSTRAIN_GLOO_HOSTNAME="pstrain-worker-$w.pstrain-worker" PSTRAIN_DRAIN_TIMEOUT_S=30 "${SEC[@]}" \
    PSTRAIN_TOKEN_FILE="$C/worker.token"
done

# The CLI from the host reaches the coordinator by address: the name to
# check in its certificate is the Service's.
PLAIN_CLI=("$BIN/client/pstrain" --coordinator "$NET.2:7000")
CLI=("${PLAIN_CLI[@]}" --tls_ca "$C/ca.pem" --tls_server_name pstrain-coordinator
     --tls_cert "$C/member.pem" --tls_key "$C/member-key.pem" --token_file "$C/user.token")
# wait_for SECONDS DESCRIPTION COMMAND...: until COMMAND succeeds, or fail.
wait_for() {
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "[pods] FAILED: no $what within $limit s"
      "${CLI[@]}" cluster || true
      [ -n "${job:-}" ] && "${CLI[@]}" status "$job" || true
      tail -n 5 "$WORK"/*.log
      exit 1
    fi
    sleep 0.2
  done
}
# status_has PATTERN: the job's status (the table) matches.
status_has() { "${CLI[@]}" status "$job" >"$WORK/status.txt" && grep -q "$1" "$WORK/status.txt"; }
cluster_has() { "${CLI[@]}" cluster >"$WORK/cluster.txt" && grep -q "$1" "$WORK/cluster.txt"; }
wait_for 60 "registered pool" cluster_has pstrain-worker-1
log "cluster up:"
"${CLI[@]}" cluster | sed 's/^/    /'

# 0. Who may not come in: plaintext, TLS without a client certificate, no
# token, the cluster's token on the people's service. Health stays open on
# its plaintext port, for the kubelet.
refused() {  # refused PATTERN COMMAND...: the command fails saying PATTERN
  if "$@" >"$WORK/refused.txt" 2>&1 || ! grep -qi "$1" "$WORK/refused.txt"; then
    echo "[pods] FAILED: expected a refusal ($1):"; cat "$WORK/refused.txt"; exit 1
  fi
}
refused "cannot reach\|unavailable\|socket closed\|handshake" "${PLAIN_CLI[@]}" list
refused "cannot reach\|unavailable\|socket closed\|handshake" "${PLAIN_CLI[@]}" --tls_ca "$C/ca.pem" \
  --tls_server_name pstrain-coordinator --token_file "$C/user.token" list
refused "bearer token" "${PLAIN_CLI[@]}" --tls_ca "$C/ca.pem" --tls_server_name pstrain-coordinator \
  --tls_cert "$C/member.pem" --tls_key "$C/member-key.pem" list
for member in worker shard coordinator; do
  refused "may not call" "${PLAIN_CLI[@]}" --tls_ca "$C/ca.pem" --tls_server_name pstrain-coordinator \
    --tls_cert "$C/member.pem" --tls_key "$C/member-key.pem" --token_file "$C/$member.token" list
done
"$BIN/client/pstrain" health "$NET.2:7001" >/dev/null
"$BIN/client/pstrain" health "$NET.3:7071" >/dev/null
log "mutual TLS and tokens: plaintext, certificate-less, token-less and member-token clients refused; health open"

# 1. A job from the host namespace, through the coordinator's address.
cat >"$WORK/job.yaml" <<YAML
name: pods
model: mlp
data: {format: synthetic, synthetic_train: 8192, synthetic_test: 1024}
consistency: sync
workers: 2
shards: 2
epochs: 2
batch_size: 32
log_every_steps: 20
YAML
job=$("${CLI[@]}" submit "$WORK/job.yaml" --output_dir out/pods | grep -o 'job-[0-9]*')
log "submitted $job"
"${CLI[@]}" watch "$job" >"$WORK/watch1.log" 2>&1 || { cat "$WORK/watch1.log"; exit 1; }
grep "final test accuracy" "$WORK/watch1.log" | sed 's/^/    /'
status_has '^state: *Succeeded'
log "$job succeeded across 5 network namespaces"

# holder_of RANK: the worker pod that holds RANK of $job (ranks follow the
# coordinator's random member order, not the pods' names).
holder_of() { "${CLI[@]}" status "$job" | awk -v r="$1" '$1 == "worker" && $2 == r {print $3; exit}'; }
# submit_long NAME EXTRA: the first job renamed NAME, for 100 epochs, with
# the lines EXTRA added and its output in out/NAME; sets $job.
submit_long() {
  sed -e 's/epochs: 2/epochs: 100/' -e "s/^name: pods/name: $1/" "$WORK/job.yaml" >"$WORK/$1.yaml"
  printf '%s' "$2" >>"$WORK/$1.yaml"
  job=$("${CLI[@]}" submit "$WORK/$1.yaml" --output_dir "out/$1" | grep -o 'job-[0-9]*')
}
# cut_rank1 WHAT: cuts the link of the worker pod that holds rank 1 of $job
# (rank 0 evaluates and is awaited); sets $victim.
cut_rank1() {
  victim=$(holder_of 1)
  log "$job $1; cutting $victim's link (rank 1)"
  ip link set "${VETH[$victim]}" down
}
# restore_link: brings $victim's link back up.
restore_link() {
  ip link set "${VETH[$victim]}" up
  log "link restored"
}

# 2. Cut a worker's link mid-run (rank 1's: rank 0 evaluates and is awaited).
submit_long cut $'max_steps: 600\ncheckpoint_every_steps: 50\n'
wait_for 60 "checkpoint" status_has '^checkpoint: '
cut_rank1 "running with a checkpoint"
wait_for 30 "requeue after the cut" status_has '^state: *Pending'
"${CLI[@]}" status "$job" >"$WORK/status-cut.txt"
grep -q "MemberLost" "$WORK/status-cut.txt" || { cat "$WORK/status-cut.txt"; exit 1; }
grep -q "$victim (rank 1) was lost" "$WORK/status-cut.txt" || { cat "$WORK/status-cut.txt"; exit 1; }
cluster_has "$victim .*LOST"
log "status reports the lost member and the job waits, requeued from its checkpoint:"
grep -E "state:|waiting:|MemberLost" "$WORK/status-cut.txt" | sed 's/^/    /'
restore_link
"${CLI[@]}" watch "$job" >"$WORK/watch2.log" 2>&1 || { cat "$WORK/watch2.log"; "${CLI[@]}" status "$job"; exit 1; }
status_has ' Restored '
log "$job resumed from its checkpoint and succeeded"

# 3. The same cut when the job may go on without the worker.
submit_long elastic $'max_steps: 2000\nmin_workers: 1\n'
wait_for 60 "100 steps" status_has 'step [1-9][0-9][0-9]/'
cut_rank1 training
wait_for 30 "the job going on without it" status_has 'running with 1 of 2 workers'
status_has '^state: *Running' || { cat "$WORK/status.txt"; exit 1; }
grep -E "state:|workers:|MemberLost" "$WORK/status.txt" | sed 's/^/    /'
restore_link
wait_for 60 "the returning worker taking its rank back" status_has 'WorkerReplaced'
grep -E "WorkerReplaced" "$WORK/status.txt" | sed 's/^/    /'
"${CLI[@]}" watch "$job" >"$WORK/watch3.log" 2>&1 || { cat "$WORK/watch3.log"; "${CLI[@]}" status "$job"; exit 1; }
status_has '^state: *Succeeded'
if grep -q '^restarts:' "$WORK/status.txt"; then cat "$WORK/status.txt"; exit 1; fi
log "$job went on through the cut, took the worker back and succeeded without a restart"
PASS=1
echo "pods test: passed"
