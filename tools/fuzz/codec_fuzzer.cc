// libFuzzer target: the gRPC tensor decoder (rpc/grpc_tensor_coding.cc) on
// arbitrary bytes, split into slices as the network would. Invariants: no
// crash or sanitizer report; a decoded tensor validates; a tensor marked
// finite is finite. Built and run by tools/fuzz/run.sh, outside CI.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "proto/parameter.pb.h"
#include "rpc/grpc_tensor_coding.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the slice size (1..128, or 4 KiB..512 KiB with the
  // bytes left in pieces as the shards take them): decoding must not
  // depend on how the bytes arrived.
  pstrain::DecodeOptions options;
  options.pieces = data[0] >= 128;
  const size_t piece = options.pieces ? (data[0] - 127u) * 4096 : 1 + data[0];
  std::vector<grpc::Slice> slices;
  for (size_t i = 1; i < size; i += piece) {
    slices.emplace_back(data + i, std::min(piece, size - i));
  }
  if (slices.empty()) slices.emplace_back("", 0);
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  pstrain::PushPullRequest header;
  std::vector<pstrain::TensorBuffer> tensors;
  if (!pstrain::DecodeTensorMessage(buffer, &header, &tensors, options).ok()) return 0;
  for (const auto& t : tensors) {
    if (!pstrain::ValidateTensorBuffer(t, "t").ok()) std::abort();
    if (t.known_finite && !pstrain::AllFinite(t)) std::abort();
    if (!pstrain::Contiguous(t).ok()) std::abort();
  }
  return 0;
}
