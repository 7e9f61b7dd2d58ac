#!/usr/bin/env bash
# Coverage-guided fuzzing with libFuzzer (Debian's clang), outside CI: the
# seeded mutation loops in `make test` are its short, always-on cousins.
#
#   tools/fuzz/run.sh codec|job_spec|checkpoint [SECONDS]   (default 60)
#
# Builds tools/fuzz/<target>_fuzzer.cc with the code it exercises under
# AddressSanitizer and UndefinedBehaviorSanitizer, seeds a corpus, runs it.
# Needs clang-14 and libclang-rt-14-dev (apt-get install them), and
# `bazel build //proto:all` for the generated protobuf sources.
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${1:?usage: tools/fuzz/run.sh codec|job_spec|checkpoint [SECONDS]}
seconds=${2:-60}
CXX=${CXX:-clang++-14}
command -v "$CXX" >/dev/null || { echo "fuzz: $CXX is missing (apt-get install clang-14 libclang-rt-14-dev)"; exit 2; }
[ -f bazel-bin/proto/parameter.pb.cc ] || bazel build //proto:all >/dev/null
OUT=${OUT:-/tmp/pstrain-fuzz}
mkdir -p "$OUT/$target/corpus"
PROTOS=(bazel-bin/proto/tensor.pb.cc bazel-bin/proto/parameter.pb.cc)
case "$target" in
  codec) SRCS=(rpc/grpc_tensor_coding.cc table/tensor_buffer.cc common/dtype.cc) ;;
  job_spec) SRCS=(common/job_spec.cc common/file_util.cc common/quote.cc common/dtype.cc) ;;
  checkpoint) SRCS=(table/optimizer.cc table/parameter_store.cc table/tensor_buffer.cc common/dtype.cc
                    common/file_util.cc common/quote.cc)
              # ShardStore is split over several files (the library's srcs).
              for f in table/shard_store*.cc; do [[ $f == *_test.cc ]] || SRCS+=("$f"); done ;;
  *) echo "fuzz: unknown target $target"; exit 2 ;;
esac
LIBS=$(pkg-config --libs grpc++ protobuf yaml-cpp zlib absl_status absl_statusor absl_strings absl_str_format \
       absl_time absl_synchronization)
echo "fuzz: building $target"
"$CXX" -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I. -Ibazel-bin "tools/fuzz/${target}_fuzzer.cc" "${SRCS[@]}" "${PROTOS[@]}" $LIBS -lpthread \
  -o "$OUT/$target/fuzzer"
# Seeds: a few valid inputs of each kind.
case "$target" in
  job_spec) cp examples/*.yaml "$OUT/$target/corpus/" ;;
  codec) printf '\x0a\x01j\x7a\x0b\x08\x01\x12\x01\x01\x1a\x04\x00\x00\x80\x3f' >"$OUT/$target/corpus/one-float" ;;
  checkpoint) : ;;  # the fuzzer starts from nothing; protobuf's structure is quick to find
esac
"$OUT/$target/fuzzer" -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 "$OUT/$target/corpus"
