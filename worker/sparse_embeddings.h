// The worker side of sparse embedding tables (docs/embeddings.md): per batch
// a worker pulls only the rows the batch touches, pools them per feature
// field into dense tensors for the model, and after the backward pass pushes
// one summed gradient per row it pulled.
//
//   EmbeddingRows       where rows live: the job's shards over gRPC
//                       (RemoteEmbeddingRows) or tables in this process
//                       (LocalEmbeddingRows: tests, one-process runs);
//   SparseEmbeddings    deduplication, pooling and the gradient push, over
//                       any EmbeddingRows.
//
// One step is Forward -> (model, loss.backward()) -> Backward, on one thread.
#ifndef PSTRAIN_WORKER_SPARSE_EMBEDDINGS_H_
#define PSTRAIN_WORKER_SPARSE_EMBEDDINGS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "embedding/embedding_table.h"
#include "proto/embedding.pb.h"
#include "rpc/grpc_embedding_client.h"
#include "worker/criteo_data.h"

namespace pstrain {

// Rows of a job's embedding tables, table t as the job lists it. Ids given
// are unique per table (SparseEmbeddings deduplicates).
class EmbeddingRows {
 public:
  virtual ~EmbeddingRows() = default;
  // rows[t] = the rows of unique_ids[t], unique_ids[t].size() x dim(t)
  // floats, row-major, for step `step`; `kind` as for GrpcEmbeddingClient
  // (kReadOnly: evaluation, nothing changes).
  virtual absl::Status Lookup(int64_t step, const std::vector<std::vector<int64_t>>& unique_ids,
                              std::vector<std::vector<float>>* rows, EmbeddingLookupKind kind) = 0;
  // grads[t]: one gradient row (dim(t) floats) per id of unique_ids[t]; the
  // gradient of step `step`. Every table is named every step, with no ids
  // where the batch had none (a SYNC shard counts a step once every rank
  // has sent it).
  virtual absl::Status Update(int64_t step, const std::vector<std::vector<int64_t>>& unique_ids,
                              const std::vector<const float*>& grads) = 0;
  virtual size_t num_tables() const = 0;
  virtual int dim(size_t table) const = 0;
  // SYNC, covering vacant ranks: the next Update's gradients sum
  // 1 + extra_batches of the step's batches, or none (`empty`: its ids and
  // gradients are not looked at). Once, for that Update.
  virtual void SetStepBatches(uint32_t /*extra_batches*/, bool /*empty*/) {}
};

// The job's shards. The client must be Init'ed (it knows the tables' dims
// from then on) and outlive this object. Thread-safety as the client's.
class RemoteEmbeddingRows : public EmbeddingRows {
 public:
  RemoteEmbeddingRows(GrpcEmbeddingClient* client, size_t num_tables) : client_(client), num_tables_(num_tables) {}
  absl::Status Lookup(int64_t step, const std::vector<std::vector<int64_t>>& unique_ids,
                      std::vector<std::vector<float>>* rows, EmbeddingLookupKind kind) override;
  absl::Status Update(int64_t step, const std::vector<std::vector<int64_t>>& unique_ids,
                      const std::vector<const float*>& grads) override;
  size_t num_tables() const override { return num_tables_; }
  int dim(size_t table) const override { return client_->dim(table); }
  void SetStepBatches(uint32_t extra_batches, bool empty) override {
    extra_batches_ = extra_batches;
    empty_ = empty;
  }

 private:
  GrpcEmbeddingClient* client_;
  const size_t num_tables_;
  uint32_t extra_batches_ = 0;
  bool empty_ = false;
};

// Whole tables in this process, with no shard and no network: what one
// ASYNC shard does for a job of one worker (each update applied at once,
// grad_scale 1, at step + 1). Owns its tables. Thread-safe (the tables are).
class LocalEmbeddingRows : public EmbeddingRows {
 public:
  // INVALID_ARGUMENT for a config EmbeddingTable refuses, or none.
  static absl::StatusOr<std::unique_ptr<LocalEmbeddingRows>> Create(const std::vector<EmbeddingTableConfig>& tables);
  absl::Status Lookup(int64_t step, const std::vector<std::vector<int64_t>>& unique_ids,
                      std::vector<std::vector<float>>* rows, EmbeddingLookupKind kind) override;
  absl::Status Update(int64_t step, const std::vector<std::vector<int64_t>>& unique_ids,
                      const std::vector<const float*>& grads) override;
  size_t num_tables() const override { return tables_.size(); }
  int dim(size_t table) const override { return tables_[table]->dim(); }
  EmbeddingTable& table(size_t t) { return *tables_[t]; }

 private:
  explicit LocalEmbeddingRows(std::vector<std::unique_ptr<EmbeddingTable>> tables) : tables_(std::move(tables)) {}
  std::vector<std::unique_ptr<EmbeddingTable>> tables_;
};

// How a field's ids (several per example in a multi-hot field) become one
// vector: torch's EmbeddingBag modes. An example with no id gets zeros in
// both modes.
enum class EmbeddingPooling { kSum, kMean };

// Field f of the batch (sparse_ids[f]) reads table `table`; several fields
// may share a table (their ids share rows).
struct SparseFieldConfig {
  int table = 0;
  EmbeddingPooling pooling = EmbeddingPooling::kSum;
};

// Turns a batch's ids into pooled tensors and their gradients into one
// Update. Per Forward, each table's ids over every field that reads it are
// deduplicated and looked up once into a leaf tensor [unique, dim] that
// requires grad; each field pools its bags from its table's leaf with
// at::embedding_bag. After loss.backward(), a leaf's grad row is already the
// sum over every occurrence of that id, so Backward pushes it as it is.
//
// Fused (every table of one dim, every field pooled alike: DLRM's case):
// the tables' rows are one leaf [sum of unique, dim], and all fields pool in
// one operation, whose output's field f is pooled[f] -- an index_select when
// every bag holds one id (Criteo), else one embedding_bag. One op and one
// backward instead of one per field: the same values and gradients.
//
// Not thread-safe: one thread runs Forward, then Backward, per step. Holds
// the last Forward's leaves until the next Forward. `rows` must outlive it.
class SparseEmbeddings {
 public:
  // fields[f] configures batch field f (at most kCriteoSparseFields); its
  // table must be < rows->num_tables(). INVALID_ARGUMENT otherwise.
  static absl::StatusOr<std::unique_ptr<SparseEmbeddings>> Create(EmbeddingRows* rows,
                                                                  std::vector<SparseFieldConfig> fields);

  // pooled[f] = field f's pooled rows, [batch.size(), dim] float32, part of
  // the autograd graph. INVALID_ARGUMENT for a batch whose offsets do not
  // describe its ids; the lookup's error as it is.
  absl::Status Forward(int64_t step, const CriteoBatch& batch, std::vector<at::Tensor>* pooled);

  // Evaluation: pooled[f] as Forward gives it, from a read-only lookup
  // (rows the shards hold, zeros for any other id; nothing is created or
  // counted), outside autograd; no Backward follows.
  absl::Status Evaluate(int64_t step, const CriteoBatch& batch, std::vector<at::Tensor>* pooled);

  // Gradient accumulation (accumulate_steps): after a micro-batch's
  // loss.backward(), adds its rows' gradients into a sum per (table, id)
  // kept until Backward, which then pushes the sum (the union of the
  // micro-batches' rows, each once). FAILED_PRECONDITION without a Forward
  // since the last Stash or Backward. `scale`: the gradients are added
  // times it (a covered batch clipped on its own: ctr_clip.h).
  absl::Status Stash(double scale = 1.0);

  // The squared L2 norm of the rows' gradients Backward would push (each
  // unique row's, summed over its occurrences: the coalesced sparse
  // gradient's), after loss.backward() (and Stash); 0 before. With
  // `last_forward_only`: the last Forward's rows' alone (none stashed).
  double GradSquaredNorm(bool last_forward_only = false) const;

  // Pushes the gradient of the last Forward's rows (zeros for a row the
  // loss did not reach), or what Stash summed, times `scale`
  // (clip_grad_norm's coefficient), for step `step`. FAILED_PRECONDITION
  // with neither a Forward nor a Stash since the last Backward.
  absl::Status Backward(int64_t step, double scale = 1.0);

  // The last Forward's unique ids per table, in the order of its rows.
  const std::vector<std::vector<int64_t>>& unique_ids() const { return unique_ids_; }
  // Whether Forward pools all fields in one operation (see above).
  bool fused() const { return fused_; }

 private:
  SparseEmbeddings(EmbeddingRows* rows, std::vector<SparseFieldConfig> fields, bool fused)
      : rows_(rows), fields_(std::move(fields)), fused_(fused) {}
  // Fills unique_ids_ and, per field, the positions of its ids in its
  // table's unique ids.
  absl::Status Deduplicate(const CriteoBatch& batch, std::vector<std::vector<int64_t>>* positions);
  // Forward and Evaluate: looks the rows up into leaves_ and pools them.
  absl::Status LookupAndPool(int64_t step, const CriteoBatch& batch, EmbeddingLookupKind kind,
                             std::vector<at::Tensor>* pooled);
  absl::Status Pool(const CriteoBatch& batch, const std::vector<std::vector<int64_t>>& positions,
                    std::vector<at::Tensor>* pooled) const;
  // The fused path's Pool, from all_.
  void PoolFused(const CriteoBatch& batch, const std::vector<std::vector<int64_t>>& positions,
                 std::vector<at::Tensor>* pooled) const;

  EmbeddingRows* rows_;
  const std::vector<SparseFieldConfig> fields_;
  const bool fused_;
  std::vector<std::vector<int64_t>> unique_ids_;
  std::vector<at::Tensor> leaves_;  // per table (the path that is not fused)
  at::Tensor all_;                  // the fused path's one leaf: table t's rows from base_[t]
  std::vector<int64_t> base_;
  bool pending_ = false;  // a Forward whose gradient is not pushed yet
  // Stash's sums, per table: ids in first-seen order, their gradient rows.
  struct Stashed {
    std::unordered_map<int64_t, size_t> row;  // id -> its index in ids
    std::vector<int64_t> ids;
    std::vector<float> grads;  // ids.size() x dim
  };
  std::vector<Stashed> stashed_;
  bool has_stash_ = false;
  // The last Forward's gradient of table t's rows (zeros where none), as
  // Backward pushes them; `keep` holds what the pointers point into.
  absl::Status LeafGradients(std::vector<at::Tensor>* keep, std::vector<const float*>* pointers) const;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_SPARSE_EMBEDDINGS_H_
