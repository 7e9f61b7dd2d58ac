// The batches one CTR step trains (worker/ctr_trainer.cc), read from a
// Criteo file: this rank's accumulate_steps micro-batches and, under SYNC
// in ps mode while ranks are vacant, the micro-batches of the vacant ranks
// it covers (worker/sampler.h's AssignBatches), read in the same pass over
// the file (CriteoReader::ReadRanks), so that every example of an epoch is
// trained once whoever trains it.
//
// Not thread-safe: the training loop's thread.
#ifndef PSTRAIN_WORKER_CTR_BATCHES_H_
#define PSTRAIN_WORKER_CTR_BATCHES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/criteo_data.h"
#include "worker/sampler.h"

namespace pstrain {

struct CtrBatchOptions {
  int rank = 0;
  int world = 1;
  int64_t batch_size = 64;
  int accumulate = 1;
  // Counted (SYNC, SSP, all-reduce): each rank's examples an epoch, -1:
  // its whole share (ASYNC). A file that ends before is an error.
  int64_t examples_per_epoch = -1;
  // Windows: every read is a ReadRanks (SYNC ps, where ranks may be
  // covered); else ReadBatch of this rank's examples.
  bool windows = false;
  std::string file;       // for messages
  bool declared = false;  // examples_per_epoch from data.train_examples (else counted)
};

// One step's batches: batches[b] holds batch b's micro-batches, this
// rank's own first (when assigned.own), then each covered rank's in
// assigned.covered's order.
struct CtrStep {
  StepBatches assigned;
  std::vector<std::vector<CriteoBatch>> batches;
  size_t micro = 0;  // micro-batches read per batch
  int64_t examples() const;
};

class CtrBatchReader {
 public:
  CtrBatchReader(std::unique_ptr<CriteoReader> reader, const CtrBatchOptions& options)
      : reader_(std::move(reader)), options_(options), left_(options.examples_per_epoch >= 0
                                                               ? options.examples_per_epoch
                                                               : INT64_MAX) {}

  // Reads and drops this rank's first `batches` batches of the epoch (a
  // resumed or replacing rank); stops early at the end of its share.
  absl::Status Skip(int64_t batches, const std::atomic<bool>* stop);
  // The next step's batches as `assigned` says (this rank's own only
  // without windows); false once the epoch is over (nothing left to read).
  absl::StatusOr<bool> Next(const StepBatches& assigned, CtrStep* step);

 private:
  // One micro-batch of every rank listed: `per_rank` examples each.
  absl::Status ReadMicro(int64_t per_rank, const StepBatches& assigned, CtrStep* step, size_t m);

  std::unique_ptr<CriteoReader> reader_;
  const CtrBatchOptions options_;
  int64_t left_;  // this rank's examples left this epoch (counted)
  bool ended_ = false;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_CTR_BATCHES_H_
