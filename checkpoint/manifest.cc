#include "checkpoint/manifest.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>

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
  if (m.id != 0) j["id"] = m.id;
  if (!m.embeddings_base.empty()) {
    j["embeddings_base"] = m.embeddings_base;
    j["embeddings_base_id"] = m.embeddings_base_id;
    j["embeddings_chain"] = m.embeddings_chain;
  }
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

uint64_t NewCheckpointId() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{rd()} << 32) | rd();
  return id;
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
    m.id = j.value("id", uint64_t{0});
    m.embeddings_base = j.value("embeddings_base", std::string());
    m.embeddings_base_id = j.value("embeddings_base_id", uint64_t{0});
    m.embeddings_chain = j.value("embeddings_chain", 0);
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
  if (!m.embeddings_base.empty() &&
      (m.embeddings_base.rfind("ckpt-", 0) != 0 || m.embeddings_base.size() > 64 ||
       m.embeddings_base.find_first_not_of("0123456789", 5) != std::string::npos || m.embeddings_base.size() == 5 ||
       m.embeddings_base_id == 0 || m.embeddings_chain < 1 || m.embeddings_chain > kMaxEmbeddingChain)) {
    return absl::DataLossError(absl::StrCat(path, " names the embedding base '", Quote(m.embeddings_base, 64),
                                            "' (id ", m.embeddings_base_id, ", chain ", m.embeddings_chain,
                                            "): not a checkpoint beside it, or a chain over ", kMaxEmbeddingChain));
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

absl::StatusOr<std::vector<EmbeddingChainLink>> EmbeddingChain(const std::string& dir,
                                                               const CheckpointManifest& manifest) {
  std::vector<EmbeddingChainLink> chain;
  auto add = [&chain](const std::string& d, const CheckpointManifest& m) {
    EmbeddingChainLink link{d, {}};
    for (const auto& f : m.embeddings) link.files.push_back(absl::StrCat(d, "/", f.file));
    chain.insert(chain.begin(), std::move(link));
  };
  add(dir, manifest);
  std::string parent = dir;  // ".../ckpt-30" or ".../ckpt-30/"
  while (parent.size() > 1 && parent.back() == '/') parent.pop_back();
  parent = std::filesystem::path(parent).parent_path().string();
  CheckpointManifest m = manifest;
  while (!m.embeddings_base.empty()) {
    // ReadManifest checked the name: a sibling ckpt-<step>.
    const std::string base_dir = absl::StrCat(parent, "/", m.embeddings_base);
    if (chain.size() > static_cast<size_t>(kMaxEmbeddingChain)) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir, "'s embeddings chain back over ",
                                              kMaxEmbeddingChain, " incremental checkpoints"));
    }
    auto base = ReadManifest(base_dir);
    if (!base.ok()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", chain.front().dir, "'s embeddings are incremental on ",
                                              base_dir, ", which cannot be read: ", base.status().message()));
    }
    if (base->id != m.embeddings_base_id || base->embeddings.empty()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", chain.front().dir, "'s embeddings are incremental on ",
                                              m.embeddings_base, " of id ", m.embeddings_base_id, ", but ", base_dir,
                                              " is checkpoint ", base->id,
                                              base->embeddings.empty() ? " without embeddings" : "",
                                              " (replaced by a later one of that step)"));
    }
    m = *std::move(base);
    add(base_dir, m);
  }
  return chain;
}

}  // namespace pstrain
