#include "common/job_spec.h"

#include <gtest/gtest.h>

#include <random>

namespace pstrain {
namespace {

// The spec is refused (INVALID_ARGUMENT) with a message holding `words`.
void ExpectRefused(const std::string& yaml, const std::string& words) {
  auto s = ParseJobSpec(yaml);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << yaml;
  EXPECT_NE(s.status().message().find(words), std::string::npos) << s.status();
}

TEST(JobSpecTest, DefaultsAndAFullSpec) {
  auto spec = ParseJobSpec(R"(
name: fmnist
model: lenet
data:
  format: idx
  limit_train: 100
optimizer:
  kind: sgd
  lr: 0.05
  momentum: 0.9
consistency: sync
workers: 2
shards: 3
epochs: 4
batch_size: 32
lr_schedule:
  kind: step
  step_epochs: 2
  gamma: 0.5
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "fmnist");
  EXPECT_EQ(spec->consistency, SYNC);
  EXPECT_EQ(spec->shards, 3);
  EXPECT_EQ(spec->data.limit_train, 100);
  EXPECT_EQ(spec->data.dir, "fashion-mnist");  // under the worker's --data_root
  EXPECT_TRUE(CheckDataFileNames(*spec).ok());
  EXPECT_DOUBLE_EQ(spec->optimizer.momentum(), 0.9);
  EXPECT_DOUBLE_EQ(LearningRate(*spec, 0), 0.05);
  EXPECT_DOUBLE_EQ(LearningRate(*spec, 2), 0.025);
  EXPECT_EQ(MakeTableConfig(*spec).num_workers(), 2u);
  auto empty = ParseJobSpec("{}");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->model, "lenet");
  EXPECT_EQ(empty->consistency, ASYNC);
}

TEST(JobSpecTest, WireDtypeIsParsed) {
  auto spec = ParseJobSpec("wire_dtype: bf16\nwire_error_feedback: true\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->wire_dtype, WireDtype::kBf16);
  EXPECT_TRUE(spec->wire_error_feedback);
  EXPECT_EQ(ParseJobSpec("wire_dtype: fp16\n")->wire_dtype, WireDtype::kFp16);
  EXPECT_EQ(ParseJobSpec("precision: fp16\n")->precision, Precision::kFp16);
  EXPECT_EQ(ParseJobSpec("precision: bf16\n")->precision, Precision::kBf16);
  EXPECT_EQ(ParseJobSpec("name: x\n")->requests_in_flight, 2);
  EXPECT_EQ(ParseJobSpec("name: x\n")->chunk_bytes, 1 << 20);
  EXPECT_EQ(ParseJobSpec("requests_in_flight: 0\n")->requests_in_flight, 0);
  EXPECT_EQ(ParseJobSpec("name: x\n")->wire_dtype, WireDtype::kFp32);
}

// quantization: QAT's fields, and what it cannot do yet refused by name.
TEST(JobSpecTest, QuantizationIsParsedAndItsLimitsAreNamed) {
  auto spec = ParseJobSpec(
      "model: mlp\nquantization: {mode: qat, weights: per_tensor, start_step: 10, freeze_observers_step: 50}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->quantization.qat());
  EXPECT_EQ(spec->quantization.weights, "per_tensor");
  EXPECT_EQ(spec->quantization.start_step, 10);
  EXPECT_EQ(spec->quantization.freeze_observers_step, 50);
  EXPECT_FALSE(ParseJobSpec("model: mlp\n")->quantization.qat());
  EXPECT_EQ(ParseJobSpec("quantization: {mode: qat}\n")->quantization.weights, "per_channel");  // lenet
  ExpectRefused("quantization: {mode: static}\n", "must be qat");
  // An export alone: any mode and worker count (it converts the final weights).
  auto exported = ParseJobSpec("model: mlp\nworkers: 2\nshards: 1\nquantization: {export: static, calibration: 64}\n");
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_FALSE(exported->quantization.qat());
  EXPECT_EQ(exported->quantization.export_mode, "static");
  EXPECT_EQ(exported->quantization.calibration, 64);
  ExpectRefused("quantization: {export: int4}\n", "quantization.export must be dynamic or static");
  ExpectRefused("quantization: {export: static, calibration: 0}\n", "quantization.calibration must be in 1..65536");
  ExpectRefused("quantization: {weights: per_tensor}\n", "needs mode: qat, export");
  ExpectRefused("model: torchscript:net.pt\nquantization: {export: dynamic}\n", "cannot be quantized");
  ExpectRefused("quantization: {mode: qat, weights: per_row}\n", "per_channel or per_tensor");
  ExpectRefused("quantization: {mode: qat, activations: per_channel}\n", "must be per_tensor");
  ExpectRefused("quantization: {mode: qat, start_step: -1}\n", ">= 0");
  ExpectRefused("model: torchscript:net.pt\nquantization: {mode: qat}\n", "'torchscript:net.pt' cannot be quantized");
  ExpectRefused("model: mlp\nworkers: 2\nshards: 1\nquantization: {mode: qat}\n", "consistency: sync");
  ExpectRefused("model: mlp\nworkers: 2\nmin_workers: 1\nshards: 1\nconsistency: sync\nquantization: {mode: qat}\n",
                "min_workers equal to workers");
  EXPECT_TRUE(ParseJobSpec("model: mlp\nworkers: 2\nshards: 1\nconsistency: sync\nquantization: {mode: qat}\n").ok());
  // All-reduce synchronises the observers (worker/qat_model.h).
  EXPECT_TRUE(ParseJobSpec("model: mlp\nmode: allreduce\nshards: 0\nconsistency: sync\nworkers: 2\n"
                           "quantization: {mode: qat}\n").ok());
  ExpectRefused("quantization: {mode: qat, bits: 4}\n", "bits");
  ExpectRefused("precision: bf16\nquantization: {mode: qat}\n", "precision: fp32");
  ExpectRefused("device: cuda\nquantization: {mode: qat}\n", "device: cpu");
  // Checkpoints keep the quantizers (worker/checkpoint_buffers.h).
  EXPECT_TRUE(ParseJobSpec("checkpoint_every_steps: 100\nquantization: {mode: qat}\n").ok());
}

// replicas: backups per chunk on other shards, ps mode only.
TEST(JobSpecTest, ReplicasAreCheckedAgainstTheShards) {
  EXPECT_EQ(ParseJobSpec("name: x\n")->replicas, 0);
  auto spec = ParseJobSpec("shards: 3\nreplicas: 2\ncheckpoint_every_steps: 50\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->replicas, 2);
  ExpectRefused("shards: 2\nreplicas: 2\n", "must be in 0..1");
  ExpectRefused("shards: 2\nreplicas: -1\n", "must be in 0..1");
  ExpectRefused("mode: allreduce\nshards: 0\nconsistency: sync\nreplicas: 1\n", "is for ps mode");
}

// A restore's spec that leaves chunk_bytes to the default takes the
// checkpoint's; one that sets it keeps it (and the coordinator refuses a
// mismatch).
TEST(JobSpecTest, AFieldIsAddedOnlyWhereTheSpecLeavesItToTheDefault) {
  bool added = false;
  auto yaml = WithDefaultField("name: x\nworkers: 2  # two\n", "chunk_bytes", 4 << 20, &added);
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_TRUE(added);
  auto spec = ParseJobSpec(*yaml);
  ASSERT_TRUE(spec.ok()) << spec.status() << "\n" << *yaml;
  EXPECT_EQ(spec->chunk_bytes, 4 << 20);
  EXPECT_EQ(spec->workers, 2);
  EXPECT_EQ(spec->name, "x");
  // Flow style, and an empty spec.
  yaml = WithDefaultField("{name: y, shards: 3}", "chunk_bytes", 4096, &added);
  ASSERT_TRUE(yaml.ok() && added);
  EXPECT_EQ(ParseJobSpec(*yaml)->chunk_bytes, 4096);
  EXPECT_EQ(ParseJobSpec(*yaml)->shards, 3);
  yaml = WithDefaultField("", "chunk_bytes", 4096, &added);
  ASSERT_TRUE(yaml.ok() && added);
  EXPECT_EQ(ParseJobSpec(*yaml)->chunk_bytes, 4096);
  // Set: unchanged.
  const std::string set = "chunk_bytes: 2048\n";
  yaml = WithDefaultField(set, "chunk_bytes", 4096, &added);
  ASSERT_TRUE(yaml.ok());
  EXPECT_FALSE(added);
  EXPECT_EQ(*yaml, set);
  // Not a mapping, or not YAML: refused.
  EXPECT_FALSE(WithDefaultField("- a\n- b\n", "chunk_bytes", 1, &added).ok());
  EXPECT_FALSE(WithDefaultField("{unclosed", "chunk_bytes", 1, &added).ok());
}

TEST(JobSpecTest, FilesTheWorkersReadMustBeNamedUnderTheirDataRoot) {
  for (const char* yaml : {"data: {dir: /usr/share/datasets/fashion-mnist}", "data: {dir: ../x}",
                           "data: {dir: a/../../x}", "data: {train_images: /dev/zero}",
                           "data: {test_labels: ../t10k-labels-idx1-ubyte.gz}",
                           "data: {format: csv, train_csv: /etc/passwd, test_csv: t.csv}",
                           "data: {format: csv, train_csv: t.csv, test_csv: x/../../t.csv}",
                           "model: torchscript:/var/run/secrets/token", "model: torchscript:../m.pt",
                           "data: {dir: \"a\\x01b\"}"}) {
    auto spec = ParseJobSpec(yaml, "j.yaml");
    ASSERT_TRUE(spec.ok()) << yaml << ": " << spec.status();  // stored jobs still load
    absl::Status s = CheckDataFileNames(*spec, "j.yaml");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << yaml;
    if (std::string(yaml).find("x01") == std::string::npos) {
      EXPECT_NE(s.message().find("--data_root"), absl::string_view::npos) << s;
    }
  }
  EXPECT_NE(CheckDataFileNames(*ParseJobSpec("data: {dir: /d}", "j.yaml"), "j.yaml").message().find("data.dir"),
            absl::string_view::npos);
  for (const char* yaml : {"data: {dir: fashion-mnist}", "data: {dir: ., train_images: a/b.gz}",
                           "data: {format: csv, train_csv: a/t.csv, test_csv: t.csv}",
                           "model: torchscript:models/net.pt",
                           // Fields the format does not use are not read.
                           "data: {format: synthetic, dir: /usr/share/datasets/fashion-mnist}"}) {
    auto spec = ParseJobSpec(yaml, "j.yaml");
    ASSERT_TRUE(spec.ok()) << yaml << ": " << spec.status();
    EXPECT_TRUE(CheckDataFileNames(*spec, "j.yaml").ok()) << yaml;
  }
}

TEST(JobSpecTest, CosineScheduleEndsNearMin) {
  auto spec = ParseJobSpec("epochs: 10\nlr_schedule: {kind: cosine, min_lr: 0.001}\noptimizer: {lr: 0.1}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(LearningRate(*spec, 0), 0.1);
  EXPECT_LT(LearningRate(*spec, 9), 0.01);
  EXPECT_GT(LearningRate(*spec, 9), 0.001);
}

TEST(JobSpecTest, RefusesUnknownFieldsAndBadValuesNamingTheField) {
  struct Bad {
    const char* yaml;
    const char* field;
  };
  const Bad cases[] = {
      {"epochz: 3", "epochz"},
      {"data: {formt: idx}", "data.formt"},
      {"optimizer: {kind: rmsprop}", "optimizer.kind"},
      {"optimizer: {lr: -1}", "optimizer.lr"},
      {"optimizer: {lr: fast}", "optimizer.lr"},
      {"workers: 0", "workers"},
      {"batch_size: -5", "batch_size"},
      {"consistency: eventually", "consistency"},
      {"model: resnet", "model"},
      {"mode: ring", "mode"},
      {"mode: ''", "mode"},
      {"mode: allreduce\nshards: 2", "shards"},
      {"mode: allreduce\nconsistency: async", "consistency"},
      {"mode: allreduce\nbackend: mpi", "backend"},
      {"device: tpu", "device"},
      {"precision: fp8", "precision"},
      {"requests_in_flight: -1", "requests_in_flight"},
      {"requests_in_flight: 100000", "requests_in_flight"},
      {"wire_dtype: int8", "wire_dtype"},
      {"mode: allreduce\nwire_dtype: bf16\nwire_error_feedback: true", "wire_error_feedback"},
      {"wire_error_feedback: maybe", "wire_error_feedback"},
      {"precision: fp8", "precision"},
      {"workers: 3\nmin_workers: 4", "min_workers"},
      {"min_workers: 0", "min_workers"},
      {"mode: allreduce\nworkers: 3\nmin_workers: 2", "min_workers"},
      {"replacement_timeout_s: -1", "replacement_timeout_s"},
      {"eval_every_epochs: -1", "eval_every_epochs"},
      {"eval_every_epochs: 2000000", "eval_every_epochs"},
      {"data: {format: csv}", "data.train_csv"},
      {"epochs: [1, 2]", "epochs"},
      {"data: 3", "data"},
      {"lr_schedule: {kind: linear}", "lr_schedule.kind"},
  };
  for (const Bad& c : cases) {
    auto spec = ParseJobSpec(c.yaml, "job.yaml");
    ASSERT_FALSE(spec.ok()) << c.yaml;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_NE(spec.status().message().find(c.field), absl::string_view::npos)
        << c.yaml << " -> " << spec.status().message();
    EXPECT_NE(spec.status().message().find("job.yaml"), absl::string_view::npos);
  }
  EXPECT_FALSE(ParseJobSpec("a: [unclosed").ok());
  // allreduce mode's defaults.
  auto ar = ParseJobSpec("mode: allreduce\nworkers: 2\n");
  ASSERT_TRUE(ar.ok()) << ar.status();
  EXPECT_EQ(ar->shards, 0);
  EXPECT_EQ(ar->bucket_bytes, 25 << 20);
  EXPECT_EQ(ar->consistency, SYNC);
  EXPECT_EQ(ar->backend, CollectiveBackend::kAuto);
  EXPECT_EQ(ar->mode, TrainMode::kAllReduce);
  auto typed = ParseJobSpec("mode: allreduce\nbackend: nccl\ndevice: cuda\nprecision: bf16\n");
  ASSERT_TRUE(typed.ok()) << typed.status();
  EXPECT_EQ(typed->backend, CollectiveBackend::kNccl);
  EXPECT_EQ(typed->device, DeviceChoice::kCuda);
  EXPECT_EQ(typed->precision, Precision::kBf16);
  EXPECT_STREQ(Name(typed->backend), "nccl");
  EXPECT_EQ(typed->min_workers, typed->workers);  // by default every worker is needed
  auto elastic = ParseJobSpec("workers: 3\nmin_workers: 2\nreplacement_timeout_s: 30\n");
  ASSERT_TRUE(elastic.ok()) << elastic.status();
  EXPECT_EQ(elastic->min_workers, 2);
  EXPECT_EQ(elastic->replacement_timeout_s, 30);
  EXPECT_EQ(elastic->eval_every_epochs, 1);
  auto end_only = ParseJobSpec("eval_every_epochs: 0\n");
  ASSERT_TRUE(end_only.ok()) << end_only.status();
  EXPECT_EQ(end_only->eval_every_epochs, 0);
  EXPECT_EQ(LoadJobSpec("/nonexistent.yaml").status().code(), absl::StatusCode::kNotFound);
}

// A seeded mutation loop over valid specs (bounded in time): the parser
// refuses or accepts, never throws (yaml-cpp throws from many places) and
// never accepts a spec that breaks its own invariants.
TEST(JobSpecTest, MutatedSpecsAreRefusedOrParsedNeverThrown) {
  const std::vector<std::string> seeds = {
      "name: a\nmodel: lenet\ndata: {format: idx, dir: /d}\noptimizer: {kind: sgd, lr: 0.05, momentum: 0.9}\n"
      "lr_schedule: {kind: cosine}\nmode: ps\nconsistency: async\nworkers: 2\nshards: 2\nepochs: 3\n"
      "batch_size: 64\nseed: 42\ncheckpoint_every_steps: 500\noutput_dir: out/x\n",
      "mode: allreduce\nworkers: 4\nbackend: gloo\nbucket_bytes: 1048576\n",
      "name: s\nconsistency: ssp\nstaleness: 2\noptimizer:\n  kind: adam\n  beta1: 0.8\n",
  };
  const std::string alphabet = "{}[]:,-?&*!|>'\"%@`#\n\t 0123456789abcxyz.\\\x00\xff";
  std::mt19937 rng(11);
  const absl::Time end = absl::Now() + absl::Seconds(3);
  int parsed = 0, refused = 0;
  for (int iter = 0; absl::Now() < end && iter < 100000; ++iter) {
    std::string m = seeds[rng() % seeds.size()];
    for (int e = 0; e < 1 + static_cast<int>(rng() % 4); ++e) {
      const size_t at = rng() % (m.size() + 1);
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: m.insert(at, 1, c); break;
        case 1: if (at < m.size()) m.erase(at, 1 + rng() % 6); break;
        default: if (at < m.size()) m[at] = c; break;
      }
    }
    absl::StatusOr<JobSpec> spec;
    try {
      spec = ParseJobSpec(m, "fuzz.yaml");
    } catch (...) {
      FAIL() << "ParseJobSpec threw on:\n" << m;
    }
    if (!spec.ok()) {
      ++refused;
      EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << m;
      continue;
    }
    ++parsed;
    EXPECT_GE(spec->workers, 1) << m;
    EXPECT_GE(spec->batch_size, 1) << m;
  }
  std::printf("job spec fuzz: %d parsed, %d refused\n", parsed, refused);
  EXPECT_GT(parsed, 10);
  EXPECT_GT(refused, 10);
}

}  // namespace
}  // namespace pstrain
