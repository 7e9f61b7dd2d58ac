#!/usr/bin/env bash
# On a GPU machine, from the repository root (with .gpu/ from
# tools/gpu/prepare.sh carried along): builds pstrain with CMake against
# that machine's LibTorch, then runs what is asked, and prints a summary.
#
#   tools/gpu/run.sh [tests] [bench [REPS]]     (default: tests bench 3)
#
#   tests   the gpu-tagged tests (tests/gpu_test.cc), the trainer, loss-scaling,
#           collective, all-reduce exchange, device optimizer and loss-scaler
#           tests, against this LibTorch
#   bench   bench/run.sh gpu REPS (GPU_PRECISION=bf16|fp16 for mixed precision)
#   sweep   the ps line only, REPS runs of each setting: wire fp32|bf16 x
#           2|4 shard processes x 2|unlimited requests in flight per shard,
#           then torch in one process, in the same call (default REPS 2)
#
# Settings: PSTRAIN_LIBTORCH (default: the torch of $PSTRAIN_PY, python3),
# PSTRAIN_GPU_WORK (build and prefix, default /tmp/pstrain-gpu), OUT (if
# set, logs are copied there).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PSTRAIN_PY:-python3}
WORK=${PSTRAIN_GPU_WORK:-/tmp/pstrain-gpu}
PREFIX=$WORK/prefix BUILD=$WORK/build BIN=$WORK/bin
[ -d .gpu/debs ] || { echo "no .gpu/: run tools/gpu/prepare.sh on the Debian machine and carry .gpu" >&2; exit 2; }
ACTIONS=("$@"); [ ${#ACTIONS[@]} -gt 0 ] || ACTIONS=(tests bench 3)
LOGS=$WORK/logs; mkdir -p "$PREFIX" "$BUILD" "$LOGS"
say() { echo "[gpu] $*" >&2; }
SUMMARY=()

# The Debian libraries, unpacked into a prefix (never over this system);
# absolute symlinks are pointed into the prefix, or at this system's copy.
for d in .gpu/debs/*.deb; do dpkg-deb -x "$d" "$PREFIX"; done
LIB=$PREFIX/usr/lib/x86_64-linux-gnu
find "$PREFIX" -type l | while read -r l; do
  t=$(readlink "$l")
  case "$t" in /*) if [ -e "$PREFIX$t" ]; then ln -sfn "$PREFIX$t" "$l"; elif [ ! -e "$t" ]; then rm -f "$l"; fi ;; esac
done
[ -e "$LIB/libz.so" ] || ln -sfn "$(ls /lib/x86_64-linux-gnu/libz.so.1 /usr/lib/x86_64-linux-gnu/libz.so.1 2>/dev/null | head -1)" "$LIB/libz.so"

TORCH=${PSTRAIN_LIBTORCH:-$($PY -c 'import os, torch; print(os.path.dirname(torch.__file__))')}
NCCL=$($PY -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || echo /usr)
say "LibTorch $TORCH ($($PY -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null)), NCCL $NCCL"
nvidia-smi -L >&2 || true

start=$SECONDS
cmake -G Ninja -S tools/gpu -B "$BUILD" -DPREFIX="$PREFIX" -DTORCH="$TORCH" -DGEN="$PWD/.gpu/gen" \
  -DNCCL_ROOT="$NCCL" >"$LOGS/cmake.log" 2>&1 || { tail -40 "$LOGS/cmake.log"; exit 1; }
if ! ninja -C "$BUILD" -k 0 >"$LOGS/build.log" 2>&1; then
  grep -E "error:|FAILED:|undefined reference|/ld: " "$LOGS/build.log" | cut -c1-400 | head -60
  say "build failed"; exit 1
fi
SUMMARY+=("build: $((SECONDS - start)) s")
# Bazel's layout, for bench/run.sh; the NCCL plugin next to the binaries.
mkdir -p "$BIN/worker" "$BIN/server/ps" "$BIN/server/coordinator" "$BIN/client"
ln -sfn "$BUILD/pstrain-worker" "$BIN/worker/pstrain-worker"
ln -sfn "$BUILD/pstrain-ps" "$BIN/server/ps/pstrain-ps"
ln -sfn "$BUILD/pstrain-coordinator" "$BIN/server/coordinator/pstrain-coordinator"
ln -sfn "$BUILD/pstrain" "$BIN/client/pstrain"
# RUNPATH covers a binary's own libraries, not theirs (libgrpc's libupb).
export LD_LIBRARY_PATH=$LIB:$TORCH/lib:$NCCL/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PSTRAIN_NCCL_PLUGIN=$BUILD/libpstrain_nccl.so
# The workers' --data_root (the specs' data.dir fashion-mnist lies in it).
export PSTRAIN_DATA_ROOT=$PWD/.gpu/data
export PSTRAIN_FASHION_MNIST=$PSTRAIN_DATA_ROOT/fashion-mnist
[ -d "$PSTRAIN_FASHION_MNIST" ] || { echo "no .gpu/data/fashion-mnist: run tools/gpu/prepare.sh again" >&2; exit 2; }

i=0
while [ $i -lt ${#ACTIONS[@]} ]; do
  case "${ACTIONS[$i]}" in
    tests)
      $PY worker/testdata/make_scripted_mlp.py worker/testdata/small_net.pt
      $PY worker/testdata/make_scripted_mlp.py worker/testdata/small_net_f64.pt --float64
      for t in gpu_test trainer_test loss_scaling_test collective_test gradient_exchange_test tensor_optimizer_test \
               loss_scaler_test; do
        "$BUILD/$t" >"$LOGS/$t.log" 2>&1; rc=$?
        grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|^\[  FAILED|^gpu demo" "$LOGS/$t.log" >&2
        SUMMARY+=("$t: $([ $rc -eq 0 ] && echo passed || echo FAILED) ($(grep -c '^\[       OK' "$LOGS/$t.log") ok, $(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$LOGS/$t.log") skipped)")
      done ;;
    bench)
      reps=3
      if [[ "${ACTIONS[$((i + 1))]:-}" =~ ^[0-9]+$ ]]; then i=$((i + 1)); reps=${ACTIONS[$i]}; fi
      PSTRAIN_PY=$PY PSTRAIN_BIN=$BIN bench/run.sh gpu "$reps" 2>&1 | tee "$LOGS/bench.log"
      SUMMARY+=("bench: $(tail -1 "$LOGS/bench.log")") ;;
    sweep)
      reps=2
      if [[ "${ACTIONS[$((i + 1))]:-}" =~ ^[0-9]+$ ]]; then i=$((i + 1)); reps=${ACTIONS[$i]}; fi
      for wire in fp32 bf16; do for shards in 2 4; do for inflight in 2 0; do
        line=$(GPU_LINES=ps GPU_WIRE=$wire GPU_SHARDS=$shards GPU_REQUESTS_IN_FLIGHT=$inflight PSTRAIN_PY=$PY \
          PSTRAIN_BIN=$BIN bench/run.sh gpu "$reps" 2>>"$LOGS/sweep.log" | tail -1)
        echo "$line" >>"$LOGS/sweep.log"
        SUMMARY+=("ps wire $wire, $shards shards, in flight $inflight: $($PY -c 'import json,sys; print(json.loads(sys.argv[1])["samples_per_s"]["pstrain_ps_2_workers"])' "$line") samples/s")
      done; done; done
      line=$(GPU_LINES=torch PSTRAIN_PY=$PY PSTRAIN_BIN=$BIN bench/run.sh gpu "$reps" 2>>"$LOGS/sweep.log" | tail -1)
      SUMMARY+=("torch, one process: $($PY -c 'import json,sys; print(json.loads(sys.argv[1])["samples_per_s"]["torch_one_process"])' "$line") samples/s") ;;
    *) say "unknown action ${ACTIONS[$i]}"; exit 2 ;;
  esac
  i=$((i + 1))
done
[ -n "${OUT:-}" ] && cp "$LOGS"/*.log "$OUT/" 2>/dev/null
echo "==== summary"; printf '%s\n' "${SUMMARY[@]}"
