#include "worker/sparse_embeddings.h"

#include <ATen/ops/embedding_bag.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace pstrain {

absl::Status RemoteEmbeddingRows::Lookup(int64_t step, const std::vector<std::vector<int64_t>>& unique_ids,
                                         std::vector<std::vector<float>>* rows, EmbeddingLookupKind kind) {
  return client_->Lookup(step, unique_ids, rows, kind);
}

absl::Status RemoteEmbeddingRows::Update(int64_t step, const std::vector<std::vector<int64_t>>& unique_ids,
                                         const std::vector<const float*>& grads) {
  const uint32_t extra = extra_batches_;
  const bool empty = empty_;
  extra_batches_ = 0;
  empty_ = false;
  return client_->Update(step, unique_ids, grads, extra, empty);
}

absl::StatusOr<std::unique_ptr<LocalEmbeddingRows>> LocalEmbeddingRows::Create(
    const std::vector<EmbeddingTableConfig>& configs) {
  if (configs.empty()) return absl::InvalidArgumentError("LocalEmbeddingRows needs at least one table");
  std::vector<std::unique_ptr<EmbeddingTable>> tables;
  for (const EmbeddingTableConfig& config : configs) {
    // No shard-wide budget: the process's memory is the test's or the
    // one-process run's to mind (a table's own eviction cap still holds).
    auto table = EmbeddingTable::Create(config, /*budget=*/nullptr);
    if (!table.ok()) return table.status();
    tables.push_back(std::move(*table));
  }
  return std::unique_ptr<LocalEmbeddingRows>(new LocalEmbeddingRows(std::move(tables)));
}

absl::Status LocalEmbeddingRows::Lookup(int64_t step, const std::vector<std::vector<int64_t>>& unique_ids,
                                        std::vector<std::vector<float>>* rows, EmbeddingLookupKind kind) {
  if (unique_ids.size() != tables_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ids for ", unique_ids.size(), " tables; the job has ", tables_.size()));
  }
  rows->resize(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t) {
    (*rows)[t].resize(unique_ids[t].size() * tables_[t]->dim());
    float* out = (*rows)[t].data();
    absl::Status s = kind == EmbeddingLookupKind::kReadOnly ? tables_[t]->Read(unique_ids[t], out)
                                                             : tables_[t]->Lookup(unique_ids[t], step, out);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status LocalEmbeddingRows::Update(int64_t step, const std::vector<std::vector<int64_t>>& unique_ids,
                                        const std::vector<const float*>& grads) {
  if (unique_ids.size() != tables_.size() || grads.size() != tables_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("ids for ", unique_ids.size(), " tables and grads for ",
                                                   grads.size(), "; the job has ", tables_.size()));
  }
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (unique_ids[t].empty()) continue;
    // As EmbeddingStore::Update's ASYNC path with one worker: scale
    // 1 / num_workers = 1, and optimizer steps counted from 1.
    absl::Status s = tables_[t]->Update(unique_ids[t], grads[t], step + 1, /*grad_scale=*/1.0);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SparseEmbeddings>> SparseEmbeddings::Create(EmbeddingRows* rows,
                                                                           std::vector<SparseFieldConfig> fields) {
  if (rows == nullptr) return absl::InvalidArgumentError("SparseEmbeddings needs its EmbeddingRows");
  if (fields.size() > static_cast<size_t>(kCriteoSparseFields)) {
    return absl::InvalidArgumentError(absl::StrCat(fields.size(), " sparse fields; a batch has ", kCriteoSparseFields));
  }
  for (size_t f = 0; f < fields.size(); ++f) {
    if (fields[f].table < 0 || static_cast<size_t>(fields[f].table) >= rows->num_tables()) {
      return absl::InvalidArgumentError(
          absl::StrCat("field ", f, " reads table ", fields[f].table, "; there are ", rows->num_tables()));
    }
  }
  bool fused = !fields.empty();
  for (size_t t = 1; t < rows->num_tables(); ++t) fused = fused && rows->dim(t) == rows->dim(0);
  for (const SparseFieldConfig& f : fields) fused = fused && f.pooling == fields[0].pooling;
  return std::unique_ptr<SparseEmbeddings>(new SparseEmbeddings(rows, std::move(fields), fused));
}

absl::Status SparseEmbeddings::Deduplicate(const CriteoBatch& batch, std::vector<std::vector<int64_t>>* positions) {
  const int64_t b = batch.size();
  unique_ids_.assign(rows_->num_tables(), {});
  std::vector<absl::flat_hash_map<int64_t, int64_t>> index(rows_->num_tables());
  positions->assign(fields_.size(), {});
  for (size_t f = 0; f < fields_.size(); ++f) {
    // The offsets are checked here, before embedding_bag reads them: a bad
    // batch is an error for the caller, not a torch exception mid-pool.
    const std::vector<int64_t>& offsets = batch.sparse_offsets[f];
    const std::vector<int64_t>& ids = batch.sparse_ids[f];
    if (static_cast<int64_t>(offsets.size()) != b + 1 || offsets.front() != 0 ||
        offsets.back() != static_cast<int64_t>(ids.size())) {
      return absl::InvalidArgumentError(absl::StrCat("field ", f, ": ", offsets.size(), " offsets ending at ",
                                                     offsets.empty() ? -1 : offsets.back(), " for ", b,
                                                     " examples and ", ids.size(), " ids"));
    }
    for (int64_t i = 0; i < b; ++i) {
      if (offsets[i] > offsets[i + 1]) {
        return absl::InvalidArgumentError(absl::StrCat("field ", f, ": offsets decrease at example ", i));
      }
    }
    const int t = fields_[f].table;
    std::vector<int64_t>& pos = (*positions)[f];
    pos.reserve(ids.size());
    index[t].reserve(index[t].size() + ids.size());
    for (int64_t id : ids) {
      auto [it, inserted] = index[t].try_emplace(id, static_cast<int64_t>(unique_ids_[t].size()));
      if (inserted) unique_ids_[t].push_back(id);
      pos.push_back(it->second);
    }
  }
  return absl::OkStatus();
}

absl::Status SparseEmbeddings::Pool(const CriteoBatch& batch, const std::vector<std::vector<int64_t>>& positions,
                                    std::vector<at::Tensor>* pooled) const {
  const int64_t b = batch.size();
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  pooled->clear();
  for (size_t f = 0; f < fields_.size(); ++f) {
    const int t = fields_[f].table;
    const int64_t dim = rows_->dim(t);
    if (unique_ids_[t].empty()) {
      // Every bag of the field is empty: zeros either way, and nothing for
      // the gradient to reach.
      pooled->push_back(at::zeros({b, dim}));
      continue;
    }
    // from_blob would alias the vectors this object overwrites next step;
    // autograd may keep the indices alive longer, so they are copied.
    at::Tensor indices = at::empty({static_cast<int64_t>(positions[f].size())}, i64);
    std::memcpy(indices.data_ptr<int64_t>(), positions[f].data(), positions[f].size() * sizeof(int64_t));
    at::Tensor offsets = at::empty({b + 1}, i64);
    std::memcpy(offsets.data_ptr<int64_t>(), batch.sparse_offsets[f].data(), (b + 1) * sizeof(int64_t));
    const int64_t mode = fields_[f].pooling == EmbeddingPooling::kMean ? 1 : 0;
    // include_last_offset: the batch's offsets carry the end of the last
    // bag, as CSR does; embedding_bag gives an empty bag zeros in sum and
    // mean alike.
    pooled->push_back(std::get<0>(at::embedding_bag(leaves_[t], indices, offsets, /*scale_grad_by_freq=*/false, mode,
                                                    /*sparse=*/false, /*per_sample_weights=*/{},
                                                    /*include_last_offset=*/true)));
  }
  return absl::OkStatus();
}

void SparseEmbeddings::PoolFused(const CriteoBatch& batch, const std::vector<std::vector<int64_t>>& positions,
                                 std::vector<at::Tensor>* pooled) const {
  const int64_t b = batch.size(), dim = rows_->dim(0), nf = static_cast<int64_t>(fields_.size());
  pooled->clear();
  if (base_.back() == 0) {  // no ids at all: every bag empty
    for (int64_t f = 0; f < nf; ++f) pooled->push_back(at::zeros({b, dim}));
    return;
  }
  // Field f's positions into all_ (its table's from base_), field after field.
  int64_t total = 0;
  bool one_hot = true;  // every bag one id: pooling is a gather, sum and mean alike
  for (int64_t f = 0; f < nf; ++f) {
    total += static_cast<int64_t>(positions[f].size());
    const std::vector<int64_t>& offsets = batch.sparse_offsets[f];
    for (int64_t i = 0; one_hot && i <= b; ++i) one_hot = offsets[i] == i;
  }
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  at::Tensor indices = at::empty({total}, i64);
  int64_t* out = indices.data_ptr<int64_t>();
  for (int64_t f = 0; f < nf; ++f) {
    const int64_t base = base_[fields_[f].table];
    for (int64_t p : positions[f]) *out++ = base + p;
  }
  at::Tensor all_fields;  // [nf * b, dim]: field f's bags from row f * b
  if (one_hot) {
    all_fields = at::index_select(all_, 0, indices);
  } else {
    at::Tensor offsets = at::empty({nf * b + 1}, i64);
    int64_t* o = offsets.data_ptr<int64_t>();
    int64_t start = 0;
    for (int64_t f = 0; f < nf; ++f) {
      for (int64_t i = 0; i < b; ++i) *o++ = start + batch.sparse_offsets[f][i];
      start += static_cast<int64_t>(positions[f].size());
    }
    *o = start;
    const int64_t mode = fields_[0].pooling == EmbeddingPooling::kMean ? 1 : 0;
    all_fields = std::get<0>(at::embedding_bag(all_, indices, offsets, /*scale_grad_by_freq=*/false, mode,
                                               /*sparse=*/false, /*per_sample_weights=*/{},
                                               /*include_last_offset=*/true));
  }
  for (int64_t f = 0; f < nf; ++f) pooled->push_back(all_fields.narrow(0, f * b, b));
}

absl::Status SparseEmbeddings::LookupAndPool(int64_t step, const CriteoBatch& batch, EmbeddingLookupKind kind,
                                             std::vector<at::Tensor>* pooled) {
  pending_ = false;
  leaves_.clear();
  all_ = at::Tensor();
  std::vector<std::vector<int64_t>> positions;
  absl::Status s = Deduplicate(batch, &positions);
  if (!s.ok()) return s;
  std::vector<std::vector<float>> rows;
  s = rows_->Lookup(step, unique_ids_, &rows, kind);
  if (!s.ok()) return s;
  if (rows.size() != unique_ids_.size()) {
    return absl::InternalError(absl::StrCat("lookup answered ", rows.size(), " tables of ", unique_ids_.size()));
  }
  base_.assign(unique_ids_.size() + 1, 0);
  for (size_t t = 0; t < unique_ids_.size(); ++t) {
    const int64_t n = static_cast<int64_t>(unique_ids_[t].size()), dim = rows_->dim(t);
    if (static_cast<int64_t>(rows[t].size()) != n * dim) {
      return absl::InternalError(
          absl::StrCat("lookup answered ", rows[t].size(), " floats for table ", t, "; expected ", n * dim));
    }
    base_[t + 1] = base_[t] + n;
  }
  try {
    if (fused_) {
      const int64_t dim = rows_->dim(0);
      all_ = at::empty({base_.back(), dim});
      for (size_t t = 0; t < rows.size(); ++t) {
        if (!rows[t].empty()) {
          std::memcpy(all_.data_ptr<float>() + base_[t] * dim, rows[t].data(), rows[t].size() * sizeof(float));
        }
      }
      if (kind == EmbeddingLookupKind::kTrain) all_.requires_grad_(true);
      PoolFused(batch, positions, pooled);
      return absl::OkStatus();
    }
    for (size_t t = 0; t < unique_ids_.size(); ++t) {
      const int64_t n = static_cast<int64_t>(unique_ids_[t].size()), dim = rows_->dim(t);
      at::Tensor leaf = at::empty({n, dim});
      if (n > 0) std::memcpy(leaf.data_ptr<float>(), rows[t].data(), rows[t].size() * sizeof(float));
      if (kind == EmbeddingLookupKind::kTrain) leaf.requires_grad_(true);
      leaves_.push_back(std::move(leaf));
    }
    return Pool(batch, positions, pooled);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("pooling embeddings: ", e.what_without_backtrace()));
  }
}

absl::Status SparseEmbeddings::Forward(int64_t step, const CriteoBatch& batch, std::vector<at::Tensor>* pooled) {
  absl::Status s = LookupAndPool(step, batch, EmbeddingLookupKind::kTrain, pooled);
  pending_ = s.ok();
  return s;
}

absl::Status SparseEmbeddings::Evaluate(int64_t step, const CriteoBatch& batch, std::vector<at::Tensor>* pooled) {
  return LookupAndPool(step, batch, EmbeddingLookupKind::kReadOnly, pooled);
}

absl::Status SparseEmbeddings::LeafGradients(std::vector<at::Tensor>* keep,
                                             std::vector<const float*>* pointers) const {
  keep->assign(fused_ ? 1 : leaves_.size(), at::Tensor());
  pointers->assign(unique_ids_.size(), nullptr);
  try {
    if (fused_) {
      // all_'s grad row i is already the sum over every occurrence of its id.
      const at::Tensor& g = all_.grad();
      (*keep)[0] = g.defined() ? g.contiguous() : at::zeros_like(all_);
      for (size_t t = 0; t < pointers->size(); ++t) {
        (*pointers)[t] = (*keep)[0].data_ptr<float>() + base_[t] * rows_->dim(0);
      }
    }
    for (size_t t = 0; !fused_ && t < leaves_.size(); ++t) {
      const at::Tensor& g = leaves_[t].grad();
      // A row the loss never reached (a field the model ignores) has no
      // gradient; the shard still expects one row per id.
      (*keep)[t] = g.defined() ? g.contiguous() : at::zeros_like(leaves_[t]);
      (*pointers)[t] = (*keep)[t].data_ptr<float>();
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("reading embedding gradients: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::Status SparseEmbeddings::Stash(double scale) {
  if (!pending_) return absl::FailedPreconditionError("Stash without a Forward since the last one");
  pending_ = false;
  std::vector<at::Tensor> keep;
  std::vector<const float*> grads;
  if (absl::Status s = LeafGradients(&keep, &grads); !s.ok()) return s;
  stashed_.resize(unique_ids_.size());
  for (size_t t = 0; t < unique_ids_.size(); ++t) {
    const size_t dim = static_cast<size_t>(rows_->dim(t));
    Stashed& st = stashed_[t];
    for (size_t i = 0; i < unique_ids_[t].size(); ++i) {
      auto [it, fresh] = st.row.try_emplace(unique_ids_[t][i], st.ids.size());
      if (fresh) {
        st.ids.push_back(unique_ids_[t][i]);
        st.grads.resize(st.grads.size() + dim, 0.0f);
      }
      float* sum = st.grads.data() + it->second * dim;
      const float* g = grads[t] + i * dim;
      if (scale == 1.0) {
        for (size_t d = 0; d < dim; ++d) sum[d] += g[d];
      } else {
        for (size_t d = 0; d < dim; ++d) sum[d] += static_cast<float>(g[d] * scale);
      }
    }
  }
  has_stash_ = true;
  return absl::OkStatus();
}

double SparseEmbeddings::GradSquaredNorm(bool last_forward_only) const {
  double sum = 0;
  if (last_forward_only && !pending_) return 0;
  if (has_stash_ && !last_forward_only) {
    for (const Stashed& st : stashed_) {
      for (float g : st.grads) sum += static_cast<double>(g) * g;
    }
    return sum;
  }
  if (fused_) {
    const at::Tensor& g = all_.grad();
    if (g.defined()) sum += g.to(at::kDouble).pow(2).sum().item<double>();
    return sum;
  }
  for (const at::Tensor& leaf : leaves_) {
    const at::Tensor& g = leaf.grad();
    if (g.defined()) sum += g.to(at::kDouble).pow(2).sum().item<double>();
  }
  return sum;
}

absl::Status SparseEmbeddings::Backward(int64_t step, double scale) {
  if (has_stash_) {
    if (pending_) {
      if (absl::Status s = Stash(); !s.ok()) return s;
    }
    has_stash_ = false;
    std::vector<std::vector<int64_t>> ids(stashed_.size());
    std::vector<const float*> pointers(stashed_.size());
    for (size_t t = 0; t < stashed_.size(); ++t) {
      if (scale != 1.0) {
        for (float& g : stashed_[t].grads) g = static_cast<float>(g * scale);
      }
      ids[t] = std::move(stashed_[t].ids);
      pointers[t] = stashed_[t].grads.data();
    }
    absl::Status s = rows_->Update(step, ids, pointers);
    stashed_.clear();
    return s;
  }
  if (!pending_) return absl::FailedPreconditionError("Backward without a Forward since the last one");
  pending_ = false;
  // Kept alive until Update returns: grads point into them.
  std::vector<at::Tensor> grads;
  std::vector<const float*> pointers;
  if (absl::Status s = LeafGradients(&grads, &pointers); !s.ok()) return s;
  if (scale != 1.0) {
    for (at::Tensor& g : grads) g.mul_(scale);  // each its own (contiguous() of a grad may alias it: harmless)
  }
  return rows_->Update(step, unique_ids_, pointers);
}

}  // namespace pstrain
