#include "common/embedding_spec.h"

#include <cmath>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/mapping_reader.h"

namespace pstrain {
namespace {

// Criteo's categorical fields (worker/criteo_data.h's kCriteoSparseFields;
// common/ cannot include worker/).
constexpr int kSparseFields = 26;
constexpr int kMaxTables = 64;  // as the shard's InitEmbeddings allows
constexpr int64_t kMaxDim = 4096;
constexpr int64_t kMaxVirtualShards = 1 << 20;

#define RETURN_IF_ERROR(expr) \
  do {                        \
    absl::Status _s = (expr); \
    if (!_s.ok()) return _s;  \
  } while (0)

bool InRange(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

bool GoodTableName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::Status ReadOptimizer(MappingReader& o, EmbeddingOptimizer* opt) {
  EmbeddingOptimizer::Kind kind = EmbeddingOptimizer::SGD;
  RETURN_IF_ERROR(o.ReadEnum<EmbeddingOptimizer::Kind>("kind",
                                                       {{"sgd", EmbeddingOptimizer::SGD},
                                                        {"rowwise_adagrad", EmbeddingOptimizer::ROWWISE_ADAGRAD},
                                                        {"adagrad", EmbeddingOptimizer::ADAGRAD},
                                                        {"lazy_adam", EmbeddingOptimizer::LAZY_ADAM},
                                                        {"ftrl", EmbeddingOptimizer::FTRL}},
                                                       &kind));
  opt->set_kind(kind);
  double lr = opt->lr(), eps = 0, beta1 = 0, beta2 = 0, acc = 0, fb = 0, l1 = 0, l2 = 0;
  RETURN_IF_ERROR(o.Read("lr", &lr));
  RETURN_IF_ERROR(o.Read("eps", &eps));
  RETURN_IF_ERROR(o.Read("beta1", &beta1));
  RETURN_IF_ERROR(o.Read("beta2", &beta2));
  RETURN_IF_ERROR(o.Read("initial_accumulator_value", &acc));
  RETURN_IF_ERROR(o.Read("ftrl_beta", &fb));
  RETURN_IF_ERROR(o.Read("ftrl_l1", &l1));
  RETURN_IF_ERROR(o.Read("ftrl_l2", &l2));
  if (!InRange(lr, 1e-12, 100)) return o.Error(o.Full("lr"), "must be in (0, 100]");
  if (!InRange(eps, 0, 1)) return o.Error(o.Full("eps"), "must be in [0, 1] (0: the kind's default)");
  if (!InRange(beta1, 0, 0.999999)) return o.Error(o.Full("beta1"), "must be in [0, 1) (0: 0.9)");
  if (!InRange(beta2, 0, 0.999999)) return o.Error(o.Full("beta2"), "must be in [0, 1) (0: 0.999)");
  if (!InRange(acc, 0, 1e6)) return o.Error(o.Full("initial_accumulator_value"), "must be in [0, 1e6]");
  if (!InRange(fb, 0, 1e6)) return o.Error(o.Full("ftrl_beta"), "must be in [0, 1e6] (0: 1)");
  if (!InRange(l1, 0, 1e6)) return o.Error(o.Full("ftrl_l1"), "must be in [0, 1e6]");
  if (!InRange(l2, 0, 1e6)) return o.Error(o.Full("ftrl_l2"), "must be in [0, 1e6]");
  opt->set_lr(lr);
  opt->set_eps(eps);
  opt->set_beta1(beta1);
  opt->set_beta2(beta2);
  opt->set_initial_accumulator_value(acc);
  opt->set_ftrl_beta(fb);
  opt->set_ftrl_l1(l1);
  opt->set_ftrl_l2(l2);
  return absl::OkStatus();
}

absl::Status ReadInitializer(MappingReader& i, EmbeddingInitializer* init) {
  EmbeddingInitializer::Kind kind = EmbeddingInitializer::UNIFORM;
  RETURN_IF_ERROR(i.ReadEnum<EmbeddingInitializer::Kind>(
      "kind",
      {{"uniform", EmbeddingInitializer::UNIFORM},
       {"normal", EmbeddingInitializer::NORMAL},
       {"zeros", EmbeddingInitializer::ZEROS}},
      &kind));
  double scale = 0;
  RETURN_IF_ERROR(i.Read("scale", &scale));
  if (!InRange(scale, 0, 1000)) return i.Error(i.Full("scale"), "must be in [0, 1000] (0: 1/sqrt(dim))");
  init->set_kind(kind);
  init->set_scale(scale);
  return absl::OkStatus();
}

absl::Status ReadAdmissionAndEviction(MappingReader& t, EmbeddingTableConfig* c) {
  int64_t min_count = 0;
  double probability = 0;
  RETURN_IF_ERROR(t.Nested("admission", [&](MappingReader& a) {
    RETURN_IF_ERROR(a.Read("min_count", &min_count));
    RETURN_IF_ERROR(a.Read("probability", &probability));
    if (min_count < 0 || min_count > 65535) return a.Error(a.Full("min_count"), "must be in 0..65535");
    if (!InRange(probability, 0, 1)) return a.Error(a.Full("probability"), "must be in [0, 1] (0: always)");
    return absl::OkStatus();
  }));
  c->mutable_admission()->set_min_count(static_cast<uint32_t>(min_count));
  c->mutable_admission()->set_probability(probability);
  int64_t ttl = 0, max_mb = 0;
  RETURN_IF_ERROR(t.Nested("eviction", [&](MappingReader& e) {
    RETURN_IF_ERROR(e.Read("ttl_steps", &ttl));
    RETURN_IF_ERROR(e.Read("max_memory_mb", &max_mb));
    if (ttl < 0) return e.Error(e.Full("ttl_steps"), "must be >= 0 (0: never)");
    if (max_mb < 0 || max_mb > (int64_t{1} << 30)) {
      return e.Error(e.Full("max_memory_mb"), "must be in 0..2^30 (0: no cap of its own)");
    }
    return absl::OkStatus();
  }));
  c->mutable_eviction()->set_ttl_steps(ttl);
  c->mutable_eviction()->set_max_memory_mb(static_cast<uint64_t>(max_mb));
  return absl::OkStatus();
}

absl::Status ReadTable(MappingReader& t, uint64_t job_seed, EmbeddingTableConfig* c) {
  std::string name;
  int64_t dim = 0, virtual_shards = 1024;
  uint64_t seed = job_seed;
  RETURN_IF_ERROR(t.Read("name", &name));
  if (!GoodTableName(name)) {
    return t.Error(t.Full("name"), absl::StrCat("is '", Quote(name, 64), "': must be 1..64 of [A-Za-z0-9_.-]"));
  }
  RETURN_IF_ERROR(t.Read("dim", &dim));
  if (!t.Has("dim")) return t.Error(t.Full("dim"), "is needed (1..4096)");
  if (dim < 1 || dim > kMaxDim) return t.Error(t.Full("dim"), "must be in 1..4096");
  c->set_name(name);
  c->set_dim(static_cast<uint32_t>(dim));
  c->mutable_optimizer()->set_kind(EmbeddingOptimizer::SGD);
  c->mutable_optimizer()->set_lr(0.05);
  RETURN_IF_ERROR(t.Nested("optimizer", [&](MappingReader& o) { return ReadOptimizer(o, c->mutable_optimizer()); }));
  c->mutable_initializer()->set_kind(EmbeddingInitializer::UNIFORM);
  RETURN_IF_ERROR(
      t.Nested("initializer", [&](MappingReader& i) { return ReadInitializer(i, c->mutable_initializer()); }));
  RETURN_IF_ERROR(ReadAdmissionAndEviction(t, c));
  RETURN_IF_ERROR(t.Read("seed", &seed));
  c->set_seed(seed);
  RETURN_IF_ERROR(t.Read("virtual_shards", &virtual_shards));
  if (virtual_shards < 1 || virtual_shards > kMaxVirtualShards) {
    return t.Error(t.Full("virtual_shards"), "must be in 1..1048576");
  }
  c->set_virtual_shards(static_cast<uint32_t>(virtual_shards));
  NonFinitePolicy nonfinite = NONFINITE_REJECT;
  RETURN_IF_ERROR(
      t.ReadEnum<NonFinitePolicy>("nonfinite", {{"reject", NONFINITE_REJECT}, {"skip", NONFINITE_SKIP}}, &nonfinite));
  c->set_nonfinite(nonfinite);
  return t.Check();
}

// One entry of `fields`: a table's name, or {table, pooling}.
absl::Status ReadField(const YAML::Node& node, const std::string& path, const MappingReader& parent,
                       const std::map<std::string, int>& tables, EmbeddingFieldSpec* f) {
  std::string table;
  std::string where = path;
  if (node.IsScalar()) {
    table = node.as<std::string>();
  } else if (node.IsMap()) {
    MappingReader m(node, path, parent.origin());
    RETURN_IF_ERROR(m.Read("table", &table));
    if (!m.Has("table")) return m.Error(m.Full("table"), "is needed");
    RETURN_IF_ERROR(m.ReadEnum<PoolingSpec>("pooling", {{"sum", PoolingSpec::kSum}, {"mean", PoolingSpec::kMean}},
                                            &f->pooling));
    RETURN_IF_ERROR(m.Check());
    where = m.Full("table");
  } else {
    return parent.Error(path, "must be a table's name or {table: NAME, pooling: sum|mean}");
  }
  auto it = tables.find(table);
  if (it == tables.end()) {
    return parent.Error(where, absl::StrCat("is '", Quote(table, 64), "': not one of embeddings.tables' names"));
  }
  f->table = it->second;
  return absl::OkStatus();
}

absl::Status ReadFields(MappingReader& e, const std::map<std::string, int>& tables, EmbeddingsSpec* out) {
  e.Known("fields");
  const int n = static_cast<int>(out->tables.size());
  if (!e.Has("fields")) {
    if (n != 1 && n != kSparseFields) {
      return e.Error(e.Full("fields"),
                     absl::StrCat("is needed with ", n, " tables: list the table each of the ", kSparseFields,
                                  " Criteo sparse fields reads (it may be left out with one table, read by all, ",
                                  "or 26, field f reading table f)"));
    }
    for (int f = 0; f < kSparseFields; ++f) {
      out->fields.push_back(EmbeddingFieldSpec{n == 1 ? 0 : f, PoolingSpec::kSum});
    }
    return absl::OkStatus();
  }
  const YAML::Node fields = e.node()["fields"];
  if (!fields.IsSequence() || static_cast<int>(fields.size()) != kSparseFields) {
    return e.Error(e.Full("fields"), absl::StrCat("must list ", kSparseFields,
                                                  " entries, one per Criteo sparse field, in the data's order"));
  }
  for (int f = 0; f < kSparseFields; ++f) {
    EmbeddingFieldSpec field;
    RETURN_IF_ERROR(ReadField(fields[f], absl::StrCat(e.Full("fields"), "[", f, "]"), e, tables, &field));
    out->fields.push_back(field);
  }
  return absl::OkStatus();
}

absl::Status ReadEmbeddings(MappingReader& e, uint64_t job_seed, EmbeddingsSpec* out) {
  e.Known("tables");
  const YAML::Node tables = e.node()["tables"];
  if (!tables || !tables.IsSequence() || tables.size() < 1 || tables.size() > kMaxTables) {
    return e.Error(e.Full("tables"), "must list 1..64 tables");
  }
  std::map<std::string, int> index;
  for (size_t i = 0; i < tables.size(); ++i) {
    const std::string path = absl::StrCat(e.Full("tables"), "[", i, "]");
    if (!tables[i].IsMap()) return e.Error(path, "must be a mapping (name, dim, optimizer, ...)");
    MappingReader t(tables[i], path, e.origin());
    EmbeddingTableConfig c;
    RETURN_IF_ERROR(ReadTable(t, job_seed, &c));
    if (!index.emplace(c.name(), static_cast<int>(i)).second) {
      return t.Error(t.Full("name"), absl::StrCat("'", c.name(), "' names another table too: names must be unique"));
    }
    out->tables.push_back(std::move(c));
  }
  RETURN_IF_ERROR(ReadFields(e, index, out));
  std::vector<bool> read(out->tables.size(), false);
  for (const EmbeddingFieldSpec& f : out->fields) read[f.table] = true;
  for (size_t i = 0; i < read.size(); ++i) {
    if (!read[i]) {
      return e.Error(absl::StrCat(e.Full("tables"), "[", i, "]"),
                     absl::StrCat("('", out->tables[i].name(), "') is read by no field"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadEmbeddingsSpec(MappingReader& r, uint64_t job_seed, EmbeddingsSpec* out) {
  *out = EmbeddingsSpec();
  return r.Nested("embeddings", [&](MappingReader& e) { return ReadEmbeddings(e, job_seed, out); });
}

absl::Status CheckEmbeddingJob(const JobSpec& spec, const MappingReader& r) {
  // Click models: dlrm, or a TorchScript module given the pooled embeddings
  // (worker/ctr_model.h).
  const bool dlrm = spec.model == "dlrm";
  const bool script = spec.model.rfind("torchscript:", 0) == 0;
  const bool criteo = spec.data.format == "criteo";
  const bool embeddings = !spec.embeddings.empty();
  if (dlrm && !criteo) return r.Error("model", "dlrm needs data.format: criteo");
  if (dlrm && !embeddings) return r.Error("model", "dlrm needs embeddings (its tables and the fields reading them)");
  if (embeddings && !dlrm && !script) return r.Error("embeddings", "are read only by model: dlrm or torchscript:<path>");
  if (embeddings && !criteo) return r.Error("data.format", "must be criteo for a model with embeddings");
  if (criteo && !embeddings) {
    return r.Error("data.format", "criteo is read only by model: dlrm, or a torchscript model with embeddings");
  }
  if (criteo && spec.data.train_file.empty()) return r.Error("data.train_file", "is needed for format criteo");
  if (!embeddings) return absl::OkStatus();
  // ps: the shards wait for no vacant rank (ASYNC), count the active ones
  // (SSP's bound), or complete a step with the active ones, which cover
  // the vacant ranks' batches (SYNC), so a lost one's rank may stay vacant
  // until a spare takes it over. All-reduce cannot shrink its group.
  if (spec.min_workers < spec.workers && spec.allreduce()) {
    return r.Error("min_workers", "must equal workers with embeddings in allreduce mode (hybrid: a collective "
                                  "group cannot shrink; a lost worker restarts the job)");
  }
  if (spec.min_workers < spec.workers && spec.consistency == SYNC && spec.clip_grad_norm > 0 &&
      spec.accumulate_steps > 1) {
    return r.Error("min_workers", "must equal workers in a sync job with embeddings, clip_grad_norm and "
                                  "accumulate_steps (a worker covering a lost one's batch clips each batch on its "
                                  "own: not built for micro-batches yet)");
  }
  return absl::OkStatus();
}

}  // namespace pstrain
