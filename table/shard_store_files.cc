// Checkpoint files (SaveTableAsync, LoadTableAsync: a TableSnapshot per shard, read
// back field by field as hostile input) and the chunk export and import of
// an in-process owner (the all-reduce worker).
#include <zlib.h>

#include <filesystem>
#include <new>
#include <unordered_set>

#include "common/file_util.h"
#include "common/quote.h"
#include "spdlog/spdlog.h"
#include "table/shard_store_internal.h"

namespace pstrain {

using shard_internal::NewStateSet;
using shard_internal::WorstCaseBytes;

namespace {

// An owner's buffers for chunk `c` (ExportChunks, ImportChunks): one per
// optimizer state slot besides the value, each of the chunk's dtype and
// element count (anything else would copy past the owner's buffer).
absl::Status CheckChunkState(const ShardStore::Chunk& c, const ShardStore::ChunkState& buffers, int slots) {
  if (static_cast<int>(buffers.slots.size()) != slots) {
    return absl::InvalidArgumentError(absl::StrCat("key '", Quote(c.key), "' has ", slots, " state slots"));
  }
  auto fits = [&c](const ShardStore::ElementSpan& b) { return b.dtype() == c.dtype && b.numel() == c.numel; };
  bool all_fit = fits(buffers.value);
  for (const ShardStore::ElementSpan& b : buffers.slots) all_fit = all_fit && fits(b);
  if (!all_fit) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", Quote(c.key), "' holds ", c.numel, " elements of ", DataTypeName(c.dtype)));
  }
  return absl::OkStatus();
}

}  // namespace

void ShardStore::SaveTableAsync(const SaveTableRequest& request, SaveTableResponse* response,
                                const CallOptions& /*options*/, StatusCallback done) {
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(request.job(), request.attempt());
  if (!table.ok()) return done(table.status());
  if (options_.checkpoint_root.empty()) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_index, " has no checkpoint root (pstrain-ps --checkpoint_root)")));
  }
  absl::StatusOr<std::string> path = ResolveUnderRoot(options_.checkpoint_root, request.path());
  if (!path.ok()) return done(path.status());
  TableSnapshot snap;
  snap.set_job((*table)->job);
  *snap.mutable_config() = (*table)->config;
  snap.set_shard_index(options_.shard_index);
  int64_t lo = INT64_MAX, hi = 0;
  try {
    for (const auto& c : (*table)->chunks) {
      // A replicated table: each chunk is saved by its primary alone.
      if ((*table)->replica != nullptr && !c->led.load(std::memory_order_acquire)) continue;
      std::lock_guard<std::mutex> lock(c->mu);
      if (c->pending.load(std::memory_order_acquire)) return done(shard_internal::CheckStagePusher(*c, -1));
      if (c->arrivals > 0) {
        return done(absl::FailedPreconditionError(absl::StrCat(
            "key '", Quote(c->key), "' has a SYNC step half pushed; checkpoint when every worker is paused")));
      }
      ChunkSnapshot* cs = snap.add_chunks();
      cs->set_key(c->key);
      cs->set_dtype(c->dtype);
      for (int64_t d : c->shape) cs->add_shape(d);
      cs->set_value(reinterpret_cast<const char*>(c->value.data), c->value.nbytes);
      for (size_t k = 0; k < c->state.size(); ++k) {
        ChunkSnapshot::StateSet* set = cs->add_state();  // empty: never used
        for (const TensorBuffer& b : c->state[k]) set->add_slots(reinterpret_cast<const char*>(b.data), b.nbytes);
        set->set_optimizer_step(c->optimizer_step[k]);
      }
      const int64_t v = c->version.load();
      cs->set_version(v);
      for (int64_t l : c->last_step) cs->add_last_step(l);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      response->add_keys(c->key);
    }
  } catch (const std::bad_alloc&) {
    return done(absl::ResourceExhaustedError("out of memory while building the checkpoint file"));
  }
  std::string bytes;
  if (snap.ByteSizeLong() > (size_t{1} << 31) - 1 || !snap.SerializeToString(&bytes)) {
    return done(absl::ResourceExhaustedError("the table is too large for one checkpoint file (2 GiB)"));
  }
  snap.Clear();
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(*path).parent_path(), ec);
  if (ec) return done(ErrnoToStatus(ec.value(), "cannot create the directory of", request.path()));
  absl::Status s = WriteFileAtomically(*path, bytes);
  if (!s.ok()) return done(s);
  response->set_path(request.path());
  response->set_bytes(bytes.size());
  response->set_crc32(static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size()))));
  response->set_min_version(lo == INT64_MAX ? 0 : lo);
  response->set_max_version(hi);
  done(absl::OkStatus());
}

namespace {

// Field-by-field check of one chunk of a checkpoint file against the
// snapshot's own config: a file whose size and CRC match may still have been
// crafted, or written by a bug.
absl::Status ValidateChunkSnapshot(const ChunkSnapshot& c, const TableConfig& snap_config, const std::string& file) {
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", Quote(file, 256), ": chunk '", Quote(c.key()), "' ", what));
  };
  if (c.key().empty() || c.key().size() > kMaxKeyBytes) return bad("has an empty or over-long key");
  if (c.dtype() != DT_FLOAT32 && c.dtype() != DT_FLOAT64) return bad("is not float32 or float64");
  const std::vector<int64_t> shape(c.shape().begin(), c.shape().end());
  absl::StatusOr<size_t> expected = ExpectedBytes(c.dtype(), shape);
  if (!expected.ok()) return bad(absl::StrCat("has an invalid shape: ", expected.status().message()));
  if (*expected != c.value().size()) {
    return bad(absl::StrCat("has ", c.value().size(), " value bytes for a shape of ", *expected));
  }
  if (!AllFinite(c.dtype(), reinterpret_cast<const uint8_t*>(c.value().data()), c.value().size())) {
    return bad("has NaN or Inf values");
  }
  if (c.version() < 0 || c.version() >= kMaxStep) return bad(absl::StrCat("has version ", c.version()));
  if (c.last_step_size() != static_cast<int>(snap_config.num_workers())) {
    return bad(absl::StrCat("has ", c.last_step_size(), " worker steps for ", snap_config.num_workers(), " workers"));
  }
  for (int64_t l : c.last_step()) {
    if (l < -1 || l >= kMaxStep) return bad(absl::StrCat("has a worker step of ", l));
  }
  const int sets = static_cast<int>(shard_internal::StateSets(snap_config));
  if (c.state_size() != sets) return bad(absl::StrCat("has ", c.state_size(), " optimizer state sets, not ", sets));
  const int slots = OptimizerStateSlots(snap_config.optimizer().kind());
  for (const auto& set : c.state()) {
    if (set.optimizer_step() < 0 || set.optimizer_step() >= kMaxStep) {
      return bad(absl::StrCat("has an optimizer step of ", set.optimizer_step()));
    }
    if (set.slots_size() != 0 && set.slots_size() != slots) {
      return bad(absl::StrCat("has ", set.slots_size(), " optimizer state slots, not ", slots));
    }
    for (const std::string& b : set.slots()) {
      if (b.size() != c.value().size()) return bad("has an optimizer state slot of the wrong size");
      if (!AllFinite(c.dtype(), reinterpret_cast<const uint8_t*>(b.data()), b.size())) {
        return bad("has NaN or Inf optimizer state");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// The chunks `wanted` names, from the checkpoint files (size, crc32 and
// every field checked), with the config of the file each came from.
absl::Status ReadWantedChunks(const LoadTableRequest& request, const std::vector<std::string>& paths,
                              std::unordered_map<std::string, ChunkSnapshot>& wanted,
                              std::unordered_map<std::string, TableConfig>& wanted_config) {
  std::unordered_set<std::string> found;
  for (int i = 0; i < request.files_size(); ++i) {
    const auto& f = request.files(i);
    const std::string name = Quote(f.path(), 256);
    absl::StatusOr<std::string> bytes = ReadRegularFile(paths[i], f.bytes());
    if (!bytes.ok()) return absl::DataLossError(absl::StrCat("checkpoint file ", name, ": ", bytes.status().message()));
    // The file's real size and crc32 go to this shard's log, not into the
    // error: the request names the file, and its answer must not tell the
    // caller anything about a file it was not given.
    if (bytes->size() != f.bytes()) {
      spdlog::warn("LoadTable: checkpoint file {} has {} bytes, the manifest says {}", name, bytes->size(), f.bytes());
      return absl::DataLossError(absl::StrCat("checkpoint file ", name,
                                              " is not the size the manifest says (truncated or replaced?)"));
    }
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0L, reinterpret_cast<const Bytef*>(bytes->data()), static_cast<uInt>(bytes->size())));
    if (crc != f.crc32()) {
      spdlog::warn("LoadTable: checkpoint file {} has crc32 {}, the manifest says {}", name, crc, f.crc32());
      return absl::DataLossError(absl::StrCat("checkpoint file ", name,
                                              " is corrupt (its crc32 is not the manifest's)"));
    }
    TableSnapshot snap;
    if (!snap.ParseFromString(*bytes)) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", name, " cannot be parsed"));
    }
    bytes->clear();
    bytes->shrink_to_fit();
    TableConfig snap_config = snap.config();
    if (!ValidateTableConfig(&snap_config).ok()) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", name, " has an invalid table config"));
    }
    for (ChunkSnapshot& c : *snap.mutable_chunks()) {
      auto it = wanted.find(c.key());
      if (it == wanted.end()) continue;
      absl::Status s = ValidateChunkSnapshot(c, snap_config, f.path());
      if (!s.ok()) return s;
      if (!found.insert(it->first).second) {
        return absl::DataLossError(
            absl::StrCat("chunk '", Quote(c.key()), "' appears twice in the checkpoint (file ", name, ")"));
      }
      it->second = std::move(c);
      wanted_config[it->first] = snap_config;
    }
  }
  for (const std::string& key : request.keys()) {
    if (found.count(key) == 0) {
      return absl::DataLossError(
          absl::StrCat("the checkpoint has no chunk '", Quote(key), "': it is incomplete or from another model"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ShardStore::CheckLoadRequest(const LoadTableRequest& request,
                                                                      TableConfig* config) {
  absl::Status s = ValidateTableRequest(request.job(), request.keys(), config);
  if (!s.ok()) return s;
  if (options_.checkpoint_root.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_index, " has no checkpoint root (pstrain-ps --checkpoint_root)"));
  }
  if (request.files_size() > kMaxCheckpointFiles) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", kMaxCheckpointFiles, " checkpoint files"));
  }
  // Refused before any file is read when the table exists.
  {
    absl::MutexLock lock(&mu_);
    auto it = tables_.find(request.job());
    if (it != tables_.end() && it->second->attempt >= request.attempt()) {
      s = CheckAttempt(*it->second, request.attempt());
      if (!s.ok()) return s;
      return absl::AlreadyExistsError(absl::StrCat("job '", Quote(request.job()), "' already has a table of attempt ",
                                                   request.attempt(), " on shard ", options_.shard_index,
                                                   "; restore into a new job or a new attempt"));
    }
  }
  std::vector<std::string> paths;
  for (const auto& f : request.files()) {
    absl::StatusOr<std::string> path = ResolveUnderRoot(options_.checkpoint_root, f.path());
    if (!path.ok()) return path.status();
    if (f.bytes() == 0 || f.bytes() > options_.max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint file ", Quote(f.path()), ": its size (", f.bytes(),
                                                     ") must be given, at most ", options_.max_bytes));
    }
    paths.push_back(std::move(*path));
  }
  return paths;
}

absl::StatusOr<std::unique_ptr<ShardStore::Chunk>> ShardStore::RestoreChunk(const std::string& key,
                                                                            const ChunkSnapshot& c,
                                                                            const TableConfig& old,
                                                                            const TableConfig& config) {
  TensorBuffer v;
  v.dtype = c.dtype();
  v.shape.assign(c.shape().begin(), c.shape().end());
  v.data = reinterpret_cast<const uint8_t*>(c.value().data());
  v.nbytes = c.value().size();
  absl::StatusOr<std::unique_ptr<Chunk>> made = NewChunk(key, v, config);
  if (!made.ok()) return made.status();
  Chunk& chunk = **made;
  // Optimizer state and per-worker steps carry over when they fit the new
  // table (same worker count, consistency and optimizer); otherwise they
  // start afresh.
  const int slots = OptimizerStateSlots(config.optimizer().kind());
  const bool state_fits = static_cast<size_t>(c.state_size()) == chunk.state.size() &&
                          old.optimizer().kind() == config.optimizer().kind();
  for (size_t k = 0; state_fits && k < chunk.state.size(); ++k) {
    const auto& set = c.state(static_cast<int>(k));
    if (set.slots_size() == slots && slots > 0) {
      std::vector<TensorBuffer> restored;
      for (int j = 0; j < slots; ++j) {
        absl::StatusOr<TensorBuffer> b = TensorBuffer::TryAllocate(v.dtype, v.shape);
        if (!b.ok()) return b.status();
        std::memcpy(b->MutableData(), set.slots(j).data(), v.nbytes);
        restored.push_back(std::move(*b));
      }
      chunk.state[k] = std::move(restored);
    }
    chunk.optimizer_step[k] = set.optimizer_step();
  }
  if (static_cast<size_t>(c.last_step_size()) == chunk.last_step.size()) {
    chunk.last_step.assign(c.last_step().begin(), c.last_step().end());
    chunk.clock.store(*std::min_element(chunk.last_step.begin(), chunk.last_step.end()));
  }
  chunk.version.store(c.version());
  return made;
}

void ShardStore::LoadTableAsync(const LoadTableRequest& request, LoadTableResponse* response,
                                const CallOptions& /*options*/, StatusCallback done) {
  TableConfig config = request.config();
  absl::StatusOr<std::vector<std::string>> paths = CheckLoadRequest(request, &config);
  if (!paths.ok()) return done(paths.status());
  std::unordered_map<std::string, ChunkSnapshot> wanted;
  std::unordered_map<std::string, TableConfig> wanted_config;  // the config of the file it came from
  for (const std::string& k : request.keys()) {
    if (!wanted.emplace(k, ChunkSnapshot()).second) {
      return done(absl::InvalidArgumentError(absl::StrCat("key '", Quote(k), "' appears twice")));
    }
  }
  try {
    absl::Status s = ReadWantedChunks(request, *paths, wanted, wanted_config);
    if (!s.ok()) return done(s);
  } catch (const std::bad_alloc&) {
    return done(absl::ResourceExhaustedError("out of memory while reading the checkpoint"));
  }
  uint64_t value_bytes = 0;
  for (const std::string& key : request.keys()) value_bytes += wanted[key].value().size();
  absl::StatusOr<std::shared_ptr<Table>> table =
      NewTable(request.job(), request.attempt(), config, WorstCaseBytes(config, value_bytes));
  if (!table.ok()) return done(table.status());
  int64_t lo = INT64_MAX;
  for (const std::string& key : request.keys()) {
    absl::StatusOr<std::unique_ptr<Chunk>> made = RestoreChunk(key, wanted[key], wanted_config[key], config);
    if (!made.ok()) return done(made.status());
    lo = std::min(lo, wanted[key].version());
    (*table)->index.emplace(key, (*table)->chunks.size());
    (*table)->chunks.push_back(std::move(*made));
  }
  if (absl::Status s = SetUpReplica(**table, request); !s.ok()) return done(s);
  const size_t loaded = (*table)->chunks.size();
  bool created = false;
  absl::StatusOr<std::shared_ptr<Table>> installed = Install(std::move(*table), /*keep_identical=*/false, &created);
  if (!installed.ok()) return done(installed.status());
  // Every copy restored from the same files: they agree from the start.
  if ((*installed)->replica != nullptr) ApplyRouting(*installed, request.routing());
  response->set_chunks(static_cast<uint32_t>(loaded));
  response->set_min_version(lo == INT64_MAX ? 0 : lo);
  done(absl::OkStatus());
}

absl::Status ShardStore::ExportChunks(const std::string& job, std::vector<ChunkState>* chunks) {
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(job, /*attempt=*/0);
  if (!table.ok()) return table.status();
  google::protobuf::RepeatedPtrField<std::string> keys;
  for (const ChunkState& c : *chunks) keys.Add()->assign(c.key);
  absl::StatusOr<std::vector<size_t>> index = ResolveKeys(**table, keys);
  if (!index.ok()) return index.status();
  const int slots = OptimizerStateSlots((*table)->config.optimizer().kind());
  for (size_t i = 0; i < chunks->size(); ++i) {
    ChunkState& out = (*chunks)[i];
    Chunk& c = *(*table)->chunks[(*index)[i]];
    if (absl::Status s = CheckChunkState(c, out, slots); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(c.mu);
    std::memcpy(out.value.data(), c.value.data, c.value.nbytes);
    if (c.state.empty() || c.state[0].empty()) {
      // Never updated: the state a first update would start from.
      absl::StatusOr<std::vector<TensorBuffer>> fresh = NewStateSet((*table)->config.optimizer(), c.dtype, c.shape);
      if (!fresh.ok()) return fresh.status();
      for (int j = 0; j < slots; ++j) std::memcpy(out.slots[j].data(), (*fresh)[j].data, (*fresh)[j].nbytes);
      out.optimizer_step = 0;
    } else {
      for (int j = 0; j < slots; ++j) std::memcpy(out.slots[j].data(), c.state[0][j].data, c.state[0][j].nbytes);
      out.optimizer_step = c.optimizer_step[0];
    }
  }
  return absl::OkStatus();
}

absl::Status ShardStore::ImportChunks(const std::string& job, const std::vector<ChunkState>& chunks, int64_t step) {
  absl::StatusOr<std::shared_ptr<Table>> table = FindTable(job, /*attempt=*/0);
  if (!table.ok()) return table.status();
  google::protobuf::RepeatedPtrField<std::string> keys;
  for (const ChunkState& c : chunks) keys.Add()->assign(c.key);
  absl::StatusOr<std::vector<size_t>> index = ResolveKeys(**table, keys);
  if (!index.ok()) return index.status();
  const int slots = OptimizerStateSlots((*table)->config.optimizer().kind());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkState& in = chunks[i];
    Chunk& c = *(*table)->chunks[(*index)[i]];
    if (absl::Status s = CheckChunkState(c, in, slots); !s.ok()) return s;
    // Everything allocated first: the chunk changes all at once or not at all.
    absl::StatusOr<TensorBuffer> value = TensorBuffer::TryAllocate(c.dtype, c.shape);
    if (!value.ok()) return value.status();
    std::memcpy(value->MutableData(), in.value.data(), value->nbytes);
    std::vector<TensorBuffer> set;
    for (int j = 0; j < slots; ++j) {
      absl::StatusOr<TensorBuffer> b = TensorBuffer::TryAllocate(c.dtype, c.shape);
      if (!b.ok()) return b.status();
      std::memcpy(b->MutableData(), in.slots[j].data(), b->nbytes);
      set.push_back(std::move(*b));
    }
    std::lock_guard<std::mutex> lock(c.mu);
    c.value = std::move(*value);  // readers keep the old value through its owner
    c.spare = TensorBuffer();
    if (c.state.empty()) return absl::FailedPreconditionError("the table keeps no optimizer state");
    c.state[0] = std::move(set);
    c.optimizer_step[0] = in.optimizer_step;
    for (auto& l : c.last_step) l = step;
    c.clock.store(step, std::memory_order_release);
    c.version.store(std::max(c.version.load(), in.optimizer_step), std::memory_order_release);
  }
  NotifyWaiters();
  return absl::OkStatus();
}

}  // namespace pstrain
