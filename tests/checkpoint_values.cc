#include "tests/checkpoint_values.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <torch/serialize.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "common/file_util.h"
#include "common/job_spec.h"
#include "common/partition_plan.h"
#include "embedding/embedding_files.h"
#include "embedding/row_math.h"
#include "rpc/tensor_codec.h"
#include "table/shard_store.h"
#include "worker/dataset.h"
#include "worker/evaluation.h"
#include "worker/model.h"

namespace pstrain {

absl::StatusOr<NamedTensors> ReadCheckpointValues(const std::string& dir) {
  auto manifest = ReadManifest(dir);
  if (!manifest.ok()) return manifest.status();
  auto spec = ParseJobSpec(manifest->spec_yaml, dir + "/manifest.json");
  if (!spec.ok()) return spec.status();
  auto plan = MakePartitionPlan(manifest->params, 1, static_cast<size_t>(manifest->chunk_bytes));
  if (!plan.ok()) return plan.status();
  std::vector<std::string> keys;
  for (const ChunkSpec& c : plan->chunks) keys.push_back(c.key);
  ShardStoreOptions options;
  options.checkpoint_root = "/";
  ShardStore store(options);
  const LoadTableRequest load = RestoreRequest(*manifest, RelativeToRoot("/", dir), "expected", /*attempt=*/0,
                                               MakeTableConfig(*spec), keys);
  LoadTableResponse loaded;
  absl::Status s = WaitFor([&](StatusCallback done) { store.LoadTableAsync(load, &loaded, {}, done); });
  if (!s.ok()) return s;
  PullRequest pull;
  pull.set_job("expected");
  for (const auto& k : keys) pull.add_keys(k);
  PullResponse pulled;
  std::vector<TensorBuffer> values;
  s = WaitFor([&](StatusCallback done) { store.PullAsync(pull, &pulled, &values, {}, done); });
  if (!s.ok()) return s;
  // Chunks come in parameter order, then offset order: each parameter is
  // its chunks end to end.
  std::vector<std::vector<at::Tensor>> pieces(plan->params.size());
  for (size_t i = 0; i < plan->chunks.size(); ++i) {
    auto t = BufferToTensor(values.at(i));
    if (!t.ok()) return t.status();
    pieces[plan->chunks[i].param].push_back(t->reshape({-1}).clone());
  }
  NamedTensors out;
  for (size_t p = 0; p < plan->params.size(); ++p) {
    out[plan->params[p].name] = at::cat(pieces[p]).view(plan->params[p].shape);
  }
  return out;
}

absl::StatusOr<NamedTensors> ReadWeightsFile(const std::string& path) {
  auto bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  try {
    c10::IValue value = torch::pickle_load(std::vector<char>(bytes->begin(), bytes->end()));
    NamedTensors out;
    for (const auto& entry : value.toGenericDict()) out[entry.key().toStringRef()] = entry.value().toTensor();
    return out;
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat(path, ": ", e.what_without_backtrace()));
  }
}

std::string BitwiseDifference(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return absl::StrCat(a.size(), " tensors against ", b.size());
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end()) return absl::StrCat(name, " is missing");
    if (t.sizes() != it->second.sizes() || t.scalar_type() != it->second.scalar_type()) {
      return absl::StrCat(name, ": different shapes or dtypes");
    }
    if (!at::equal(t, it->second)) {
      return absl::StrCat(name, " differs by up to ", t.sub(it->second).abs().max().item<double>());
    }
  }
  return "";
}

absl::StatusOr<double> TestAccuracyOf(const std::string& spec_yaml, const NamedTensors& values) {
  auto spec = ParseJobSpec(spec_yaml);
  if (!spec.ok()) return spec.status();
  auto data = LoadData(spec->data, spec->seed);
  if (!data.ok()) return data.status();
  std::vector<int64_t> input_shape(data->train.inputs.sizes().begin() + 1, data->train.inputs.sizes().end());
  auto model = CreateModel(spec->model, input_shape, spec->data.num_classes, spec->seed);
  if (!model.ok()) return model.status();
  {
    c10::NoGradGuard no_grad;
    for (auto& [name, t] : (*model)->NamedParameters()) {
      auto it = values.find(name);
      if (it == values.end()) return absl::NotFoundError(absl::StrCat("no values for ", name));
      t.copy_(it->second);
    }
  }
  return Evaluate(**model, data->test, c10::Device(c10::kCPU), spec->precision).accuracy;
}

absl::StatusOr<EmbeddingRows> ReadEmbeddingRows(const std::vector<std::vector<std::string>>& chain) {
  auto tables = ReadEmbeddingFiles(chain);
  if (!tables.ok()) return tables.status();
  EmbeddingRows rows;
  for (const auto& table : *tables) {
    const size_t dim = table->dim();
    const size_t slots = SlotFloats(table->config().optimizer().kind(), dim);
    auto& out = rows[table->config().name()];
    absl::Status s = table->ForEachRow([&](const EmbeddingRowView& r) {
      std::string bytes(reinterpret_cast<const char*>(r.value), dim * sizeof(float));
      bytes.append(reinterpret_cast<const char*>(r.slots), slots * sizeof(float));
      bytes.append(reinterpret_cast<const char*>(&r.last_step), sizeof(r.last_step));
      bytes.append(reinterpret_cast<const char*>(&r.count), sizeof(r.count));
      out[r.id] = std::move(bytes);
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
  }
  return rows;
}

std::string EmbeddingRowDifference(const EmbeddingRows& a, const EmbeddingRows& b) {
  if (a.size() != b.size()) return "the number of tables differs";
  for (const auto& [name, rows] : a) {
    auto it = b.find(name);
    if (it == b.end()) return "table " + name + " is missing";
    if (rows.size() != it->second.size()) {
      return "table " + name + ": " + std::to_string(rows.size()) + " rows vs " + std::to_string(it->second.size());
    }
    for (const auto& [id, bytes] : rows) {
      auto row = it->second.find(id);
      if (row == it->second.end()) return "table " + name + ": id " + std::to_string(id) + " is missing";
      if (row->second != bytes) return "table " + name + ": id " + std::to_string(id) + " differs";
    }
  }
  return "";
}

}  // namespace pstrain
