#include "checkpoint/manifest.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/quote.h"

namespace pstrain {

absl::Status WriteManifest(const std::string& dir, const CheckpointManifest& m) {
  nlohmann::json j;
  j["format"] = "pstrain-checkpoint-1";
  j["job"] = m.job;
  j["name"] = m.name;
  j["step"] = m.step;
  j["created_unix_ms"] = m.created_unix_ms;
  j["spec_yaml"] = m.spec_yaml;
  j["chunk_bytes"] = m.chunk_bytes;
  // Empty lists are written as [] (the reader requires every key).
  j["params"] = nlohmann::json::array();
  j["workers"] = nlohmann::json::array();
  j["shards"] = nlohmann::json::array();
  for (const ParameterSpec& p : m.params) {
    j["params"].push_back({{"name", p.name}, {"shape", p.shape}, {"dtype", static_cast<int>(p.dtype)}});
  }
  for (const auto& w : m.workers) {
    nlohmann::json worker = {{"rank", w.rank}, {"step", w.step}, {"epoch", w.epoch}, {"epoch_step", w.epoch_step}};
    if (w.loss_scale > 0) worker["loss_scale"] = w.loss_scale;
    j["workers"].push_back(std::move(worker));
  }
  for (const auto& s : m.shards) {
    j["shards"].push_back({{"index", s.index}, {"file", s.file}, {"bytes", s.bytes}, {"crc32", s.crc32}});
  }
  // Only where there are some: a manifest without embeddings reads as
  // before in every version.
  for (const auto& s : m.embeddings) {
    j["embeddings"].push_back({{"index", s.index}, {"file", s.file}, {"bytes", s.bytes}, {"crc32", s.crc32}});
  }
  for (const auto& s : m.buffers) {
    j["buffers"].push_back({{"index", s.index}, {"file", s.file}, {"bytes", s.bytes}, {"crc32", s.crc32}});
  }
  return WriteFileAtomically(dir + "/" + kManifestName, j.dump(2) + "\n");
}

bool ValidLossScale(double scale) { return std::isfinite(scale) && scale >= 0x1p-24 && scale <= 0x1p127; }

absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifestName;
  // A manifest is a few KiB per parameter; 64 MiB bounds what a crafted one
  // can make us buffer.
  absl::StatusOr<std::string> text = ReadRegularFile(path, 64 << 20);
  if (!text.ok() && !absl::IsNotFound(text.status())) {
    return absl::DataLossError(absl::StrCat(Quote(dir, 256), ": ", text.status().message()));
  }
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat(dir, " is not a checkpoint: it has no ", kManifestName,
                                            " (an interrupted checkpoint never gets one)"));
  }
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "pstrain-checkpoint-1") {
    return absl::DataLossError(absl::StrCat(path, " is not a pstrain checkpoint manifest"));
  }
  CheckpointManifest m;
  try {
    m.job = j.at("job").get<std::string>();
    m.name = j.at("name").get<std::string>();
    m.step = j.at("step").get<int64_t>();
    m.created_unix_ms = j.value("created_unix_ms", int64_t{0});
    m.spec_yaml = j.at("spec_yaml").get<std::string>();
    m.chunk_bytes = j.at("chunk_bytes").get<int64_t>();
    for (const auto& p : j.at("params")) {
      ParameterSpec spec;
      spec.name = p.at("name").get<std::string>();
      spec.shape = p.at("shape").get<std::vector<int64_t>>();
      spec.dtype = static_cast<DataType>(p.at("dtype").get<int>());
      m.params.push_back(std::move(spec));
    }
    for (const auto& w : j.at("workers")) {
      m.workers.push_back({w.at("rank").get<int>(), w.at("step").get<int64_t>(), w.at("epoch").get<int>(),
                           w.at("epoch_step").get<int64_t>(), w.value("loss_scale", 0.0)});
      const double scale = m.workers.back().loss_scale;
      if (scale != 0 && !ValidLossScale(scale)) {
        return absl::DataLossError(absl::StrCat(path, " gives worker ", m.workers.back().rank, " the loss scale ",
                                                scale, ", outside [2^-24, 2^127]"));
      }
    }
    for (const auto& s : j.at("shards")) {
      m.shards.push_back({s.at("index").get<int>(), s.at("file").get<std::string>(), s.at("bytes").get<uint64_t>(),
                          s.at("crc32").get<uint32_t>()});
    }
    for (const char* key : {"embeddings", "buffers"}) {
      if (!j.contains(key)) continue;
      for (const auto& s : j.at(key)) {
        (key[0] == 'e' ? m.embeddings : m.buffers)
            .push_back({s.at("index").get<int>(), s.at("file").get<std::string>(), s.at("bytes").get<uint64_t>(),
                        s.at("crc32").get<uint32_t>()});
      }
    }
    if (m.buffers.size() > 1) return absl::DataLossError(absl::StrCat(path, " lists more than one buffers file"));
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, " is incomplete: ", e.what()));
  }
  if (m.params.empty() || m.shards.empty()) {
    return absl::DataLossError(absl::StrCat(path, " lists no parameters or no shard files"));
  }
  std::vector<CheckpointManifest::ShardFile> files = m.shards;
  files.insert(files.end(), m.embeddings.begin(), m.embeddings.end());
  files.insert(files.end(), m.buffers.begin(), m.buffers.end());
  for (const auto& s : files) {
    // Shard and embedding files lie in the checkpoint directory itself.
    if (s.file.empty() || s.file.size() > 255 || s.file.find('/') != std::string::npos || s.file == "." ||
        s.file == ".." || s.file.find('\0') != std::string::npos) {
      return absl::DataLossError(absl::StrCat(path, " names a shard file '", Quote(s.file),
                                              "' outside its directory"));
    }
    if (s.bytes == 0) return absl::DataLossError(absl::StrCat(path, " gives shard file ", s.file, " no size"));
    std::error_code ec;
    const auto size = std::filesystem::file_size(dir + "/" + s.file, ec);
    if (ec) return absl::DataLossError(absl::StrCat("checkpoint ", dir, " is missing ", s.file));
    if (size != s.bytes) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", dir, "/", s.file, " has ", size,
                                              " bytes, the manifest says ", s.bytes));
    }
  }
  return m;
}

std::vector<CheckpointManifest::Worker> StartPositions(const CheckpointManifest& manifest, int workers) {
  if (static_cast<int>(manifest.workers.size()) == workers) return manifest.workers;
  // Another worker count: every rank starts the epoch again at the
  // checkpoint's step, with the smallest loss scale any rank had (a scale
  // too high costs skipped steps, one too low only grows back).
  int epoch = INT32_MAX;
  double scale = 0;
  for (const auto& w : manifest.workers) {
    epoch = std::min(epoch, w.epoch);
    if (w.loss_scale > 0 && (scale == 0 || w.loss_scale < scale)) scale = w.loss_scale;
  }
  if (epoch == INT32_MAX) epoch = 0;
  std::vector<CheckpointManifest::Worker> out;
  for (int r = 0; r < workers; ++r) out.push_back({r, manifest.step, epoch, 0, scale});
  return out;
}

}  // namespace pstrain
