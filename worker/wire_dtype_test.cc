// The wire dtypes' conversions (table/tensor_buffer.h), which shards and
// workers use on both ends, against LibTorch's own: narrowing rounds to
// nearest even exactly as at::Tensor::to() does, bit for bit, over random
// values and the edges (subnormals of both formats, the largest finite
// values, overflow to Inf, signed zeros, NaN); widening is exact; and error
// feedback carries what rounding lost, so the sum of what was sent tracks
// the sum of the gradients.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "table/tensor_buffer.h"

namespace pstrain {
namespace {

std::vector<float> Samples() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65520.0f, 65519.0f, 1e5f, -1e5f,
                          6.1035156e-05f, 5.9604645e-08f, 2.9802322e-08f, 1e-9f, 1e-40f, -1e-40f,
                          std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          1.00390625f, 1.005859375f, 3.14159265f, 0.1f, 1.0f + 1.0f / 128, 1.0f + 3.0f / 256};
  torch::manual_seed(3);
  for (float scale : {1e-8f, 1e-4f, 1.0f, 1e3f, 1e6f}) {
    at::Tensor r = torch::randn({20000}) * scale;
    v.insert(v.end(), r.data_ptr<float>(), r.data_ptr<float>() + r.numel());
  }
  return v;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(WireDtypeTest, NarrowingMatchesLibTorchBitForBit) {
  const std::vector<float> v = Samples();
  const at::Tensor src = torch::from_blob(const_cast<float*>(v.data()), {static_cast<int64_t>(v.size())});
  for (auto [dtype, torch_dtype] : {std::pair{DT_BFLOAT16, at::kBFloat16}, std::pair{DT_FLOAT16, at::kHalf}}) {
    std::vector<uint16_t> ours(v.size());
    NarrowElements(dtype, v.data(), nullptr, v.size(), reinterpret_cast<uint8_t*>(ours.data()));
    const at::Tensor theirs = src.to(torch_dtype).contiguous();
    const uint16_t* t = reinterpret_cast<const uint16_t*>(theirs.data_ptr());
    int mismatches = 0;
    for (size_t i = 0; i < v.size() && mismatches < 5; ++i) {
      if (ours[i] != t[i]) {
        ++mismatches;
        ADD_FAILURE() << (dtype == DT_BFLOAT16 ? "bf16" : "fp16") << " of " << v[i] << " (0x" << std::hex
                      << Bits(v[i]) << "): ours 0x" << ours[i] << ", LibTorch 0x" << t[i];
      }
    }
    // With error feedback (residuals zero, as on the first step) the same
    // bits go out -- but for -0, which plus the residual +0 goes as +0 --
    // and each residual is exactly what the rounding lost (none where what
    // went out is not finite).
    std::vector<uint16_t> fed(v.size());
    std::vector<float> residual(v.size(), 0.0f);
    NarrowElements(dtype, v.data(), residual.data(), v.size(), reinterpret_cast<uint8_t*>(fed.data()));
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t expect = Bits(v[i]) == 0x80000000u ? 0 : ours[i];
      ASSERT_EQ(fed[i], expect) << "with feedback, element " << i << " (" << v[i] << ")";
    }
    const at::Tensor lost = src - theirs.to(at::kFloat);
    const at::Tensor expect_residual = at::where(at::isfinite(lost), lost, at::zeros_like(lost)).contiguous();
    EXPECT_EQ(std::memcmp(residual.data(), expect_residual.data_ptr<float>(), v.size() * 4), 0);
    // Widening: exact, as LibTorch's.
    std::vector<float> back(v.size());
    const bool finite = WidenElements(dtype, reinterpret_cast<const uint8_t*>(ours.data()), v.size(), back.data());
    EXPECT_FALSE(finite);  // the samples hold Inf
    const at::Tensor wide = theirs.to(at::kFloat).contiguous();
    EXPECT_EQ(std::memcmp(back.data(), wide.data_ptr<float>(), v.size() * 4), 0);
    // The in-process round trip equals narrowing then widening.
    std::vector<float> round(v.size());
    RoundThrough(dtype, v.data(), v.size(), round.data());
    EXPECT_EQ(std::memcmp(round.data(), back.data(), v.size() * 4), 0);
  }
  // NaN stays NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DataType dtype : {DT_BFLOAT16, DT_FLOAT16}) {
    uint16_t h;
    float f;
    NarrowElements(dtype, &nan, nullptr, 1, reinterpret_cast<uint8_t*>(&h));
    WidenElements(dtype, reinterpret_cast<uint8_t*>(&h), 1, &f);
    EXPECT_TRUE(std::isnan(f));
  }
}

TEST(WireDtypeTest, ErrorFeedbackCarriesWhatRoundingLost) {
  // 1000 steps of the same small gradient on top of a large one: bf16 (8 bits
  // of mantissa) loses the small part every step without feedback.
  const size_t n = 256;
  std::vector<float> grad(n), residual(n, 0.0f), sent_sum(n, 0.0), plain_sum(n, 0.0);
  for (size_t i = 0; i < n; ++i) grad[i] = 1.0f + 1e-3f * static_cast<float>(i % 7);
  std::vector<uint16_t> wire(n), plain(n);
  std::vector<float> widened(n);
  const int steps = 1000;
  for (int s = 0; s < steps; ++s) {
    NarrowElements(DT_BFLOAT16, grad.data(), residual.data(), n, reinterpret_cast<uint8_t*>(wire.data()));
    WidenElements(DT_BFLOAT16, reinterpret_cast<uint8_t*>(wire.data()), n, widened.data());
    for (size_t i = 0; i < n; ++i) sent_sum[i] += widened[i];
    NarrowElements(DT_BFLOAT16, grad.data(), nullptr, n, reinterpret_cast<uint8_t*>(plain.data()));
    WidenElements(DT_BFLOAT16, reinterpret_cast<uint8_t*>(plain.data()), n, widened.data());
    for (size_t i = 0; i < n; ++i) plain_sum[i] += widened[i];
  }
  double worst_feedback = 0, worst_plain = 0;
  for (size_t i = 0; i < n; ++i) {
    const double truth = static_cast<double>(grad[i]) * steps;
    worst_feedback = std::max(worst_feedback, std::abs(sent_sum[i] - truth) / truth);
    worst_plain = std::max(worst_plain, std::abs(plain_sum[i] - truth) / truth);
  }
  EXPECT_LT(worst_feedback, 1e-5);  // at most one step's rounding, over 1000 steps
  EXPECT_GT(worst_plain, 1e-3);     // without it the error piles up
  for (float r : residual) EXPECT_LT(std::abs(r), 0.01f);
}

}  // namespace
}  // namespace pstrain
