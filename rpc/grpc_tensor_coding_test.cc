#include "rpc/grpc_tensor_coding.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "proto/parameter.pb.h"
#include "rpc/tensor_codec.h"

namespace pstrain {
namespace {

std::string Flatten(const grpc::ByteBuffer& bb) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(bb.Dump(&slices).ok());
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

grpc::ByteBuffer FromString(const std::string& s, size_t piece = 0) {
  // Optionally split into many slices, as a network receive would.
  std::vector<grpc::Slice> slices;
  if (piece == 0) piece = s.size() == 0 ? 1 : s.size();
  for (size_t i = 0; i < s.size(); i += piece) slices.emplace_back(s.data() + i, std::min(piece, s.size() - i));
  if (slices.empty()) slices.emplace_back("", 0);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

at::Tensor RandomTensor(c10::ScalarType type, std::vector<int64_t> shape) {
  if (type == c10::ScalarType::Bool) return at::randint(0, 2, shape).to(type);
  if (c10::isIntegralType(type, /*includeBool=*/false)) return at::randint(0, 200, shape).to(type);
  return at::randn(shape).to(type);
}

struct Case {
  c10::ScalarType type;
  int64_t numel;
};

class TensorCodingTest : public ::testing::TestWithParam<Case> {};

// Every dtype, at sizes from empty to 64 MiB: encode with the zero-copy path,
// parse with the plain protobuf parser, and decode with our decoder from one
// slice and from many odd-sized slices.
TEST_P(TensorCodingTest, RoundTripsAndParsesWithPlainProtobuf) {
  const Case& c = GetParam();
  at::Tensor t = RandomTensor(c.type, {c.numel});
  auto buf = TensorToBuffer(t);
  ASSERT_TRUE(buf.ok()) << buf.status();

  PushRequest header;
  header.set_job("job");
  header.set_worker(3);
  header.set_step(17);
  header.add_keys("k#0");
  grpc::ByteBuffer bb;
  ASSERT_TRUE(EncodeTensorMessage(header, {*buf}, &bb).ok());

  const std::string wire = Flatten(bb);
  PushRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  EXPECT_EQ(parsed.job(), "job");
  EXPECT_EQ(parsed.worker(), 3u);
  EXPECT_EQ(parsed.step(), 17);
  ASSERT_EQ(parsed.grads_size(), 1);
  EXPECT_EQ(parsed.grads(0).dtype(), buf->dtype);
  ASSERT_EQ(parsed.grads(0).shape_size(), 1);
  EXPECT_EQ(parsed.grads(0).shape(0), c.numel);
  ASSERT_EQ(parsed.grads(0).data().size(), buf->nbytes);
  EXPECT_EQ(0, std::memcmp(parsed.grads(0).data().data(), buf->data, buf->nbytes));

  for (size_t piece : {size_t{0}, size_t{4093}}) {
    grpc::ByteBuffer in = piece == 0 ? bb : FromString(wire, piece);
    PushRequest h;
    std::vector<TensorBuffer> tensors;
    absl::Status s = DecodeTensorMessage(in, &h, &tensors);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(h.job(), "job");
    EXPECT_EQ(h.grads_size(), 0);
    ASSERT_EQ(tensors.size(), 1u);
    auto back = BufferToTensor(tensors[0]);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->scalar_type(), c.type);
    EXPECT_TRUE(at::equal(*back, t));
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllDtypesAndSizes, TensorCodingTest,
    ::testing::Values(Case{c10::ScalarType::Float, 0}, Case{c10::ScalarType::Float, 1},
                      Case{c10::ScalarType::Float, 1000}, Case{c10::ScalarType::Float, 16 << 20},
                      Case{c10::ScalarType::Double, 0}, Case{c10::ScalarType::Double, 3},
                      Case{c10::ScalarType::Double, 200000}, Case{c10::ScalarType::Half, 0},
                      Case{c10::ScalarType::Half, 7}, Case{c10::ScalarType::Half, 100000},
                      Case{c10::ScalarType::BFloat16, 0}, Case{c10::ScalarType::BFloat16, 9},
                      Case{c10::ScalarType::BFloat16, 100000}, Case{c10::ScalarType::Int, 0},
                      Case{c10::ScalarType::Int, 5}, Case{c10::ScalarType::Int, 300000},
                      Case{c10::ScalarType::Long, 0}, Case{c10::ScalarType::Long, 2},
                      Case{c10::ScalarType::Long, 300000}, Case{c10::ScalarType::Byte, 0},
                      Case{c10::ScalarType::Byte, 1}, Case{c10::ScalarType::Byte, 1 << 20},
                      Case{c10::ScalarType::Bool, 0}, Case{c10::ScalarType::Bool, 1},
                      Case{c10::ScalarType::Bool, 70000}));

TEST(TensorCodingTest, SixtyFourMiBTensorIsSentFromItsOwnMemory) {
  at::Tensor t = at::randn({16 << 20});  // 64 MiB of float32
  auto buf = TensorToBuffer(t);
  ASSERT_TRUE(buf.ok());
  EXPECT_EQ(buf->data, t.data_ptr());  // the view copied nothing
  grpc::ByteBuffer bb;
  ASSERT_TRUE(EncodeTensorMessage(PullResponse(), {*buf}, &bb).ok());
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(bb.Dump(&slices).ok());
  bool points_into_tensor = false;
  for (const auto& s : slices) {
    if (s.begin() == t.data_ptr() && s.size() == static_cast<size_t>(t.nbytes())) {
      points_into_tensor = true;
    }
  }
  EXPECT_TRUE(points_into_tensor) << "the 64 MiB payload was copied into the message";
  EXPECT_LT(bb.Length(), static_cast<size_t>(t.nbytes()) + 32) << "unexpected framing overhead";
}

TEST(TensorCodingTest, EncodedTensorOutlivesTheCallersReference) {
  grpc::ByteBuffer bb;
  std::vector<float> expected;
  {
    at::Tensor t = at::arange(100000, at::kFloat);
    expected.assign(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
    auto buf = TensorToBuffer(t);
    ASSERT_TRUE(EncodeTensorMessage(PullResponse(), {*buf}, &bb).ok());
  }  // the tensor's last outside reference is gone; the slices keep it alive
  PullResponse h;
  std::vector<TensorBuffer> out;
  ASSERT_TRUE(DecodeTensorMessage(bb, &h, &out).ok());
  ASSERT_EQ(out[0].nbytes, expected.size() * 4);
  EXPECT_EQ(0, std::memcmp(out[0].data, expected.data(), out[0].nbytes));
}

TEST(TensorCodingTest, NonContiguousAndZeroDimTensors) {
  at::Tensor m = at::randn({64, 33});
  at::Tensor tr = m.t();  // non-contiguous view
  at::Tensor scalar = at::scalar_tensor(2.5, at::kDouble);
  auto a = TensorToBuffer(tr);
  auto b = TensorToBuffer(scalar);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(b->shape.size(), 0u);
  EXPECT_EQ(b->nbytes, 8u);
  grpc::ByteBuffer bb;
  ASSERT_TRUE(EncodeTensorMessage(PullResponse(), {*a, *b}, &bb).ok());
  PullResponse h;
  std::vector<TensorBuffer> out;
  ASSERT_TRUE(DecodeTensorMessage(bb, &h, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  auto ta = BufferToTensor(out[0]);
  auto tb = BufferToTensor(out[1]);
  ASSERT_TRUE(ta.ok() && tb.ok());
  EXPECT_TRUE(at::equal(*ta, tr));
  EXPECT_EQ(tb->dim(), 0);
  EXPECT_DOUBLE_EQ(tb->item<double>(), 2.5);
}

TEST(TensorCodingTest, ReceivedAlignedBytesAreNotCopiedAgain) {
  at::Tensor t = at::randn({50000});
  auto buf = TensorToBuffer(t);
  grpc::ByteBuffer bb;
  ASSERT_TRUE(EncodeTensorMessage(PullResponse(), {*buf}, &bb).ok());
  PullResponse h;
  std::vector<TensorBuffer> out;
  ASSERT_TRUE(DecodeTensorMessage(bb, &h, &out).ok());
  // In process the received slice is the sender's: the decoded view and the
  // tensor built over it point at the same bytes.
  EXPECT_EQ(out[0].data, t.data_ptr());
  auto back = BufferToTensor(out[0]);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->data_ptr(), t.data_ptr());
}

// Narrow values (a job's wire_dtype) for float32 destinations are widened
// as they are copied in, from slices split anywhere (even inside an
// element), exactly as LibTorch widens; a size that does not fit is refused.
TEST(TensorCodingTest, NarrowValuesAreWidenedIntoFloat32Destinations) {
  for (auto [dtype, torch_dtype] : {std::pair{DT_BFLOAT16, at::kBFloat16}, std::pair{DT_FLOAT16, at::kHalf}}) {
    at::Tensor values = at::randn({70001}).to(torch_dtype);
    auto narrow = TensorToBuffer(values);
    ASSERT_TRUE(narrow.ok());
    ASSERT_EQ(narrow->dtype, dtype);
    grpc::ByteBuffer bb;
    ASSERT_TRUE(EncodeTensorMessage(PullResponse(), {*narrow}, &bb).ok());
    const std::string bytes = Flatten(bb);
    for (size_t piece : {size_t{0}, size_t{4097}, size_t{65537}}) {
      at::Tensor into = at::randn({70001}).zero_();
      auto dest = TensorToBuffer(into);
      ASSERT_TRUE(dest.ok());
      std::vector<TensorBuffer> destinations = {*dest}, out;
      PullResponse h;
      absl::Status s = DecodeTensorMessage(FromString(bytes, piece), &h, &out, &destinations);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(out[0].dtype, DT_FLOAT32);
      EXPECT_EQ(out[0].data, into.data_ptr());
      EXPECT_TRUE(out[0].known_finite);
      EXPECT_TRUE(at::equal(into, values.to(at::kFloat))) << "piece " << piece;
    }
    // A destination of the wire dtype (a worker that widens on its GPU)
    // receives the bytes as they are.
    at::Tensor narrow_into = at::randn({70001}).zero_().to(torch_dtype);
    std::vector<TensorBuffer> narrow_dest = {*TensorToBuffer(narrow_into)}, narrow_out;
    PullResponse nh;
    ASSERT_TRUE(DecodeTensorMessage(FromString(bytes, 4097), &nh, &narrow_out, &narrow_dest).ok());
    EXPECT_EQ(narrow_out[0].data, narrow_into.data_ptr());
    EXPECT_TRUE(at::equal(narrow_into, values));
    // A float32 destination of another size: refused.
    at::Tensor small = at::randn({70000}).zero_();
    std::vector<TensorBuffer> wrong = {*TensorToBuffer(small)}, out;
    PullResponse h;
    EXPECT_EQ(DecodeTensorMessage(FromString(bytes), &h, &out, &wrong).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(TensorCodingTest, RejectsMalformedInput) {
  at::Tensor t = at::randn({1000});
  auto buf = TensorToBuffer(t);
  PushRequest header;
  header.set_job("j");
  grpc::ByteBuffer bb;
  ASSERT_TRUE(EncodeTensorMessage(header, {*buf}, &bb).ok());
  const std::string wire = Flatten(bb);
  // Every truncation is refused cleanly.
  for (size_t cut : {size_t{1}, size_t{5}, size_t{12}, wire.size() / 2, wire.size() - 1}) {
    PushRequest h;
    std::vector<TensorBuffer> out;
    absl::Status s = DecodeTensorMessage(FromString(wire.substr(0, cut)), &h, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "cut at " << cut << ": " << s;
    EXPECT_TRUE(out.empty());
  }
  // Shape that does not match the byte count.
  TensorBuffer lying = *buf;
  lying.shape = {999};
  EXPECT_EQ(EncodeTensorMessage(header, {lying}, &bb).code(), absl::StatusCode::kInvalidArgument);
  PushRequest proto;
  auto* g = proto.add_grads();
  g->set_dtype(DT_FLOAT32);
  g->add_shape(10);
  g->set_data(std::string(39, 'x'));
  PushRequest h;
  std::vector<TensorBuffer> out;
  absl::Status s = DecodeTensorMessage(FromString(proto.SerializeAsString()), &h, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("needs 40"), absl::string_view::npos) << s;
  g->set_dtype(static_cast<DataType>(42));
  s = DecodeTensorMessage(FromString(proto.SerializeAsString()), &h, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  // Negative dimension.
  g->set_dtype(DT_FLOAT32);
  g->set_shape(0, -10);
  s = DecodeTensorMessage(FromString(proto.SerializeAsString()), &h, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  // Garbage.
  s = DecodeTensorMessage(FromString(std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11)), &h, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorCodingTest, DecodesWhatThePlainProtobufSerializerWrites) {
  // A peer that does not use our encoder (plain protobuf) is understood too.
  PushRequest proto;
  proto.set_job("plain");
  proto.add_keys("a");
  proto.add_keys("b");
  for (int i = 0; i < 2; ++i) {
    auto* g = proto.add_grads();
    g->set_dtype(DT_INT64);
    g->add_shape(2);
    g->add_shape(3);
    std::string data(48, 0);
    for (int k = 0; k < 6; ++k) data[k * 8] = static_cast<char>(k + i);
    g->set_data(data);
  }
  PushRequest h;
  std::vector<TensorBuffer> out;
  ASSERT_TRUE(DecodeTensorMessage(FromString(proto.SerializeAsString(), 7), &h, &out).ok());
  EXPECT_EQ(h.job(), "plain");
  EXPECT_EQ(h.keys_size(), 2);
  ASSERT_EQ(out.size(), 2u);
  auto t = BufferToTensor(out[1]);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->flatten()[5].item<int64_t>(), 6);
}

// A tensor record may give its data before its dtype (valid protobuf). The
// NaN/Inf check that runs while the bytes are copied must not count then: it
// ran before the element type was known.
TEST(TensorCodingTest, FinitenessIsDecidedAfterTheWholeRecord) {
  const float values[4] = {1.f, std::nanf(""), 2.f, 3.f};
  std::string record;
  record += '\x1a';  // field 3 (data), length-delimited
  record += static_cast<char>(sizeof(values));
  record.append(reinterpret_cast<const char*>(values), sizeof(values));
  record += "\x12\x01\x04";  // field 2 (shape), packed: [4]
  record += "\x08\x01";      // field 1 (dtype) = DT_FLOAT32, last
  std::string wire = "\x0a\x01j";  // job = "j"
  wire += '\x7a';                   // field 15, length-delimited
  wire += static_cast<char>(record.size());
  wire += record;
  // Many small slices: the bytes are copied (and checked) on the way.
  for (size_t piece : {size_t{0}, size_t{3}, size_t{5}}) {
    PushRequest h;
    std::vector<TensorBuffer> out;
    absl::Status s = DecodeTensorMessage(FromString(wire, piece), &h, &out);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].dtype, DT_FLOAT32);
    EXPECT_FALSE(out[0].known_finite) << "piece " << piece;
    EXPECT_FALSE(AllFinite(out[0].dtype, out[0].data, out[0].nbytes));
  }
}

// DecodeOptions.pieces: a float tensor spread over received slices is left
// in them -- valid after the message is gone, the same bytes -- while small
// tensors, other dtypes and bytes trickled in tiny slices are as without it.
TEST(TensorCodingTest, FloatBytesSpreadOverSlicesAreLeftInPiecesOnRequest) {
  for (auto type : {c10::kFloat, c10::kDouble, c10::kBFloat16, c10::kHalf, c10::kLong}) {
    at::Tensor small = RandomTensor(type, {100});
    at::Tensor large = RandomTensor(type, {300'001});
    grpc::ByteBuffer bb;
    ASSERT_TRUE(EncodeTensorMessage(PushRequest(), {*TensorToBuffer(small), *TensorToBuffer(large)}, &bb).ok());
    const std::string bytes = Flatten(bb);
    for (size_t piece : {size_t{65536}, size_t{65537}, size_t{100}}) {
      for (bool pieces : {false, true}) {
        std::vector<TensorBuffer> out;
        {
          grpc::ByteBuffer received = FromString(bytes, piece);
          PushRequest h;
          DecodeOptions options;
          options.pieces = pieces;
          absl::Status s = DecodeTensorMessage(received, &h, &out, options);
          ASSERT_TRUE(s.ok()) << s;
        }  // the received message is gone; the tensors hold what they need
        ASSERT_EQ(out.size(), 2u);
        EXPECT_EQ(out[0].pieces, nullptr);
        const bool expect_pieces = pieces && piece >= 4096 && type != c10::kLong;
        EXPECT_EQ(out[1].pieces != nullptr, expect_pieces) << type << " piece " << piece;
        if (expect_pieces) {
          EXPECT_EQ(out[1].data, nullptr);
          EXPECT_GE(out[1].pieces->spans.size(), out[1].nbytes / piece);
        }
        for (int k = 0; k < 2; ++k) {
          ASSERT_TRUE(ValidateTensorBuffer(out[k], "t").ok());
          absl::StatusOr<TensorBuffer> whole = Contiguous(out[k]);
          ASSERT_TRUE(whole.ok());
          auto back = BufferToTensor(*whole);
          ASSERT_TRUE(back.ok());
          EXPECT_TRUE(at::equal(*back, k == 0 ? small : large)) << type << " piece " << piece;
        }
      }
    }
  }
}

// A seeded mutation loop over valid encodings (bounded in time): the decoder
// never crashes, hangs or over-reads (ASan/valgrind would see it), accepts
// only tensors that validate, and never claims finiteness that is false.
TEST(TensorCodingTest, MutatedMessagesAreRefusedOrDecodedConsistently) {
  std::vector<std::string> seeds;
  for (auto type : {c10::kFloat, c10::kDouble, c10::kInt, c10::kByte}) {
    for (int64_t n : {0, 1, 7, 300, 5000}) {
      PushRequest header;
      header.set_job("fuzz");
      header.set_worker(3);
      header.add_keys("k");
      grpc::ByteBuffer bb;
      auto buf = TensorToBuffer(RandomTensor(type, {n}));
      ASSERT_TRUE(buf.ok());
      ASSERT_TRUE(EncodeTensorMessage(header, {*buf, *buf}, &bb).ok());
      seeds.push_back(Flatten(bb));
    }
  }
  // Mutated strings are often invalid UTF-8, which protobuf logs per parse.
  google::protobuf::LogHandler* previous = google::protobuf::SetLogHandler(nullptr);
  std::mt19937 rng(20261123);
  const absl::Time end = absl::Now() + absl::Seconds(3);
  int decoded = 0, refused = 0;
  for (int iter = 0; absl::Now() < end && iter < 200000; ++iter) {
    std::string m = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !m.empty(); ++e) {
      const size_t at = rng() % m.size();
      switch (rng() % 5) {
        case 0: m[at] = static_cast<char>(rng()); break;                          // flip a byte
        case 1: m.erase(at, 1 + rng() % 8); break;                                // cut
        case 2: m.insert(at, std::string(1 + rng() % 8, static_cast<char>(rng()))); break;  // grow
        case 3: m[at] = static_cast<char>(0x80 | rng()); break;                   // long varints
        default: m = m.substr(0, at); break;                                      // truncate
      }
    }
    PushRequest h;
    std::vector<TensorBuffer> out;
    absl::Status s = DecodeTensorMessage(FromString(m, 1 + rng() % 16), &h, &out);
    // The same bytes in large slices, left in pieces where they are: the
    // same verdict and the same tensors.
    PushRequest hp;
    std::vector<TensorBuffer> outp;
    DecodeOptions pieces;
    pieces.pieces = true;
    absl::Status sp = DecodeTensorMessage(FromString(m, 4096 + rng() % 8192), &hp, &outp, pieces);
    ASSERT_EQ(s.ok(), sp.ok()) << s << " / " << sp;
    if (!s.ok()) {
      ++refused;
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      continue;
    }
    ++decoded;
    ASSERT_EQ(outp.size(), out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_TRUE(ValidateTensorBuffer(out[i], "t").ok());
      if (out[i].known_finite) {
        ASSERT_TRUE(AllFinite(out[i].dtype, out[i].data, out[i].nbytes));
      }
      ASSERT_TRUE(ValidateTensorBuffer(outp[i], "t").ok());
      if (outp[i].known_finite) {
        ASSERT_TRUE(AllFinite(outp[i]));
      }
      absl::StatusOr<TensorBuffer> whole = Contiguous(outp[i]);
      ASSERT_TRUE(whole.ok());
      ASSERT_EQ(whole->dtype, out[i].dtype);
      ASSERT_EQ(whole->nbytes, out[i].nbytes);
      ASSERT_TRUE(out[i].nbytes == 0 || std::memcmp(whole->data, out[i].data, out[i].nbytes) == 0);
    }
  }
  google::protobuf::SetLogHandler(previous);
  std::printf("tensor codec fuzz: %d decoded, %d refused\n", decoded, refused);
  EXPECT_GT(decoded + refused, 1000);
}

// A tensor of a few bytes may arrive in a slice that keeps its bytes inline
// (in the grpc::Slice object; gRPC's parser makes such slices for short
// ranges). Decoded, it must point at bytes that outlive the received
// message and the decoder's own copies of the slices.
TEST(TensorCodingTest, TensorsInTinySlicesOutliveTheMessage) {
  PushRequest header;
  header.set_job("tiny");
  std::vector<TensorBuffer> sent;
  for (int k = 0; k < 3; ++k) {
    TensorBuffer t = TensorBuffer::Allocate(DT_UINT8, {7});
    for (int i = 0; i < 7; ++i) t.MutableData()[i] = static_cast<uint8_t>(0x40 + 10 * k + i);
    sent.push_back(t);
  }
  grpc::ByteBuffer bb;
  ASSERT_TRUE(EncodeTensorMessage(header, sent, &bb).ok());
  const std::string bytes = Flatten(bb);
  // Decode from every slice size, keeping all results, so that later
  // decodes reuse whatever memory earlier ones freed; then look.
  std::vector<std::vector<TensorBuffer>> kept;
  for (size_t piece = 1; piece <= bytes.size(); ++piece) {
    for (bool pieces : {false, true}) {
      PushRequest h;
      std::vector<TensorBuffer> out;
      DecodeOptions options;
      options.pieces = pieces;
      ASSERT_TRUE(DecodeTensorMessage(FromString(bytes, piece), &h, &out, options).ok());
      kept.push_back(std::move(out));
    }
  }
  for (size_t d = 0; d < kept.size(); ++d) {
    ASSERT_EQ(kept[d].size(), 3u);
    for (int k = 0; k < 3; ++k) {
      ASSERT_EQ(kept[d][k].nbytes, 7u);
      EXPECT_EQ(std::memcmp(kept[d][k].data, sent[k].data, 7), 0) << "slices of " << 1 + d / 2 << " bytes, tensor " << k;
    }
  }
}

}  // namespace
}  // namespace pstrain
