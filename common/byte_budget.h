// A shard's memory budget (pstrain-ps --max_memory_mb), shared by everything
// that grows on it: reservations are atomic, so tables on many threads never
// overshoot the cap together.
#ifndef PSTRAIN_COMMON_BYTE_BUDGET_H_
#define PSTRAIN_COMMON_BYTE_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <limits>

namespace pstrain {

class ByteBudget {
 public:
  // 0: no cap.
  explicit ByteBudget(uint64_t max_bytes) : max_(max_bytes == 0 ? std::numeric_limits<uint64_t>::max() : max_bytes) {}
  ByteBudget(const ByteBudget&) = delete;
  ByteBudget& operator=(const ByteBudget&) = delete;

  // Takes `n` bytes if they fit; false (and nothing taken) otherwise.
  bool TryReserve(uint64_t n) {
    uint64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (n > max_ || used > max_ - n) return false;
    } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
    return true;
  }
  // Takes `n` bytes whether or not they fit: for memory already allocated
  // (a hash index that grew past its estimate), so `used` stays the truth.
  void Charge(uint64_t n) { used_.fetch_add(n, std::memory_order_relaxed); }
  void Release(uint64_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }

  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t max() const { return max_; }

 private:
  const uint64_t max_;
  std::atomic<uint64_t> used_{0};
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_BYTE_BUDGET_H_
