#include "worker/ctr_batches.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace pstrain {
namespace {

// Where a counted epoch's size came from, for a message.
std::string EpochSource(const CtrBatchOptions& o) {
  return absl::StrCat(o.declared ? "data.train_examples" : "counted", ": ", o.examples_per_epoch * o.world,
                      " examples in all");
}

}  // namespace

int64_t CtrStep::examples() const {
  int64_t n = 0;
  for (const auto& batch : batches) {
    for (size_t m = 0; m < micro && m < batch.size(); ++m) n += batch[m].size();
  }
  return n;
}

absl::Status CtrBatchReader::Skip(int64_t batches, const std::atomic<bool>* stop) {
  CriteoBatch scratch;
  for (int64_t i = 0; i < batches * options_.accumulate && left_ > 0; ++i) {
    if (stop != nullptr && stop->load()) return absl::CancelledError("job cancelled while skipping trained batches");
    if (options_.windows) {
      const int64_t want = std::min(options_.batch_size, left_);
      absl::StatusOr<int64_t> read = reader_->ReadRanks(want, {}, {});
      if (!read.ok()) return read.status();
      left_ -= want;
      continue;
    }
    if (absl::Status s = reader_->ReadBatch(options_.batch_size, &scratch); !s.ok()) return s;
    if (scratch.size() == 0) break;  // a share ending early: the epoch is over
    if (left_ != INT64_MAX) left_ -= scratch.size();
  }
  return absl::OkStatus();
}

absl::Status CtrBatchReader::ReadMicro(int64_t per_rank, const StepBatches& assigned, CtrStep* step, size_t m) {
  std::vector<int> ranks;
  std::vector<CriteoBatch*> out;
  size_t b = 0;
  if (assigned.own) {
    ranks.push_back(options_.rank);
    out.push_back(&step->batches[b++][m]);
  }
  for (int v : assigned.covered) {
    ranks.push_back(v);
    out.push_back(&step->batches[b++][m]);
  }
  absl::StatusOr<int64_t> read = reader_->ReadRanks(per_rank, ranks, out);
  if (!read.ok()) return read.status();
  if (*read < per_rank * options_.world) {
    return absl::FailedPreconditionError(absl::StrCat(
        "train file ", options_.file, " ended ", per_rank * options_.world - *read, " examples short of the step's ",
        per_rank, " per rank (", options_.examples_per_epoch, " per rank and epoch, ", EpochSource(options_),
        "); did the file change?"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> CtrBatchReader::Next(const StepBatches& assigned, CtrStep* step) {
  step->assigned = options_.windows ? assigned : StepBatches{};
  step->batches.resize((step->assigned.own ? 1 : 0) + step->assigned.covered.size());
  for (auto& batch : step->batches) batch.resize(static_cast<size_t>(options_.accumulate));
  step->micro = 0;
  if (ended_) return false;
  size_t n = 0;
  for (; n < static_cast<size_t>(options_.accumulate) && left_ > 0; ++n) {
    const int64_t want = std::min(options_.batch_size, left_);
    if (options_.windows) {
      if (absl::Status s = ReadMicro(want, step->assigned, step, n); !s.ok()) return s;
      left_ -= want;
      continue;
    }
    CriteoBatch& batch = step->batches[0][n];
    if (absl::Status s = reader_->ReadBatch(want, &batch); !s.ok()) return s;
    if (batch.size() == 0 && options_.examples_per_epoch >= 0) {
      // The other ranks would wait for this one's steps.
      return absl::FailedPreconditionError(absl::StrCat(
          "train file ", options_.file, " ended ", left_, " examples short of this rank's ",
          options_.examples_per_epoch, " per epoch (", EpochSource(options_), "); did the file change?"));
    }
    if (batch.size() == 0) {
      ended_ = true;
      break;
    }
    if (left_ != INT64_MAX) left_ -= batch.size();
  }
  step->micro = n;
  return n > 0;
}

}  // namespace pstrain
