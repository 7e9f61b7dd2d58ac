// Bytes in pieces (TensorBuffer.pieces, ForEachRun): every element visited
// once, in order, with its value, however the bytes were cut and wherever
// the pieces lie.
#include "table/tensor_buffer.h"
#include "table/shard_store_testing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace pstrain {
namespace {

using testing_util::InPieces;

TensorBuffer Random(DataType dtype, int64_t n, std::mt19937& rng) {
  TensorBuffer t = TensorBuffer::Allocate(dtype, {n});
  std::uniform_int_distribution<uint32_t> bits;
  for (size_t i = 0; i < t.nbytes; ++i) t.MutableData()[i] = static_cast<uint8_t>(bits(rng));
  return t;
}

TEST(ForEachRunTest, VisitsEveryElementOnceInOrderHoweverTheBytesWereCut) {
  std::mt19937 rng(7);
  for (DataType dtype : {DT_FLOAT32, DT_FLOAT64, DT_BFLOAT16}) {
    const size_t elem = DataTypeSize(dtype);
    for (size_t max_piece : {1, 3, 7, 64, 4099, 70000}) {
      const TensorBuffer whole = Random(dtype, 50'000, rng);
      const TensorBuffer cut = InPieces(whole, rng, max_piece);
      ASSERT_TRUE(ValidateTensorBuffer(cut, "cut").ok());
      std::vector<uint8_t> seen;
      size_t next = 0, runs = 0;
      ForEachRun(cut, elem, [&](size_t first, const uint8_t* p, size_t n) {
        EXPECT_EQ(first, next) << "runs out of order";
        EXPECT_GT(n, 0u);
        seen.insert(seen.end(), p, p + n * elem);
        next = first + n;
        ++runs;
      });
      EXPECT_EQ(next, 50'000u) << DataTypeName(dtype) << " pieces of up to " << max_piece;
      ASSERT_EQ(seen.size(), whole.nbytes);
      EXPECT_EQ(std::memcmp(seen.data(), whole.data, whole.nbytes), 0);
      if (max_piece >= 4099) EXPECT_LT(runs, 50'000u / 4);  // large pieces are read in place, not element by element
      absl::StatusOr<TensorBuffer> back = Contiguous(cut);
      ASSERT_TRUE(back.ok());
      EXPECT_EQ(back->pieces, nullptr);
      EXPECT_EQ(std::memcmp(back->data, whole.data, whole.nbytes), 0);
    }
  }
}

TEST(ForEachRunTest, ContiguousBytesAreOneRun) {
  std::mt19937 rng(1);
  const TensorBuffer whole = Random(DT_FLOAT32, 1000, rng);
  int runs = 0;
  ForEachRun(whole, 4, [&](size_t first, const uint8_t* p, size_t n) {
    EXPECT_EQ(first, 0u);
    EXPECT_EQ(p, whole.data);
    EXPECT_EQ(n, 1000u);
    ++runs;
  });
  EXPECT_EQ(runs, 1);
}

// A NaN or Inf anywhere -- inside a piece or split between two -- is found.
TEST(ForEachRunTest, NonFiniteElementsAreFoundWhereverTheyLie) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    TensorBuffer whole = TensorBuffer::Allocate(DT_FLOAT32, {4096});
    float* f = reinterpret_cast<float*>(whole.MutableData());
    for (int i = 0; i < 4096; ++i) f[i] = static_cast<float>(i) - 2000.5f;
    const TensorBuffer clean = InPieces(whole, rng, 97);
    EXPECT_TRUE(AllFinite(clean));
    f[std::uniform_int_distribution<int>(0, 4095)(rng)] =
        trial % 2 ? std::numeric_limits<float>::quiet_NaN() : -std::numeric_limits<float>::infinity();
    EXPECT_FALSE(AllFinite(InPieces(whole, rng, 97))) << "trial " << trial;
  }
}

TEST(ForEachRunTest, NarrowPiecesWidenAsTheWholeBufferDoes) {
  std::mt19937 rng(5);
  for (DataType dtype : {DT_BFLOAT16, DT_FLOAT16}) {
    const TensorBuffer whole = Random(dtype, 30'001, rng);
    absl::StatusOr<TensorBuffer> a = WidenToFloat32(whole);
    absl::StatusOr<TensorBuffer> b = WidenToFloat32(InPieces(whole, rng, 5000));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes), 0);  // bit for bit, NaNs included
    EXPECT_EQ(a->known_finite, b->known_finite);
  }
}

TEST(ForEachRunTest, PiecesThatDoNotAddUpAreRefused) {
  std::mt19937 rng(9);
  const TensorBuffer whole = Random(DT_FLOAT32, 100, rng);
  TensorBuffer cut = InPieces(whole, rng, 30);
  cut.nbytes -= 4;
  cut.shape = {99};
  EXPECT_FALSE(ValidateTensorBuffer(cut, "short").ok());
  TensorBuffer both = InPieces(whole, rng, 30);
  both.data = whole.data;
  EXPECT_FALSE(ValidateTensorBuffer(both, "both").ok());
}

}  // namespace
}  // namespace pstrain
