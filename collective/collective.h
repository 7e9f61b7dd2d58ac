// Collective: the all-reduce mode's communication between workers, as
// PyTorch's ProcessGroup offers it -- AllReduce, Broadcast, AllGather and
// Barrier on tensors, each returning a handle to wait on, so a caller can
// start a reduction and go on computing (the trainer reduces gradient
// buckets while backward is still running).
//
// Backends: Gloo (CPU tensors, TCP; c10d::ProcessGroupGloo from LibTorch
// over Debian's libgloo) and NCCL (CUDA tensors; built when a CUDA toolkit
// with NCCL is found, see @cuda). Members find each other through a
// KeyValueStore: the coordinator's per-job KV store, or a TCPStore served by
// rank 0 at MASTER_ADDR:MASTER_PORT when launched the torchrun way.
//
// Errors: a peer that dies or stops answering fails the pending and later
// operations with UNAVAILABLE (or DEADLINE_EXCEEDED after `timeout`), never
// a hang.
#ifndef PSTRAIN_COLLECTIVE_COLLECTIVE_H_
#define PSTRAIN_COLLECTIVE_COLLECTIVE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pstrain {

// Rendezvous: a small shared key-value store. Get waits up to `timeout` for
// the key to be set.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
};

// A store in this process's memory: for ranks that are threads of one
// process (tests, benchmarks).
std::shared_ptr<KeyValueStore> NewInMemoryStore();

// torchrun's rendezvous: rank 0 serves a c10d::TCPStore on host:port, every
// rank (rank 0 too) connects to it. Waits up to `timeout` for the others.
absl::StatusOr<std::shared_ptr<KeyValueStore>> ConnectTcpStore(const std::string& host, int port, bool serve,
                                                               int world_size, absl::Duration timeout);

class CollectiveWork {
 public:
  virtual ~CollectiveWork() = default;
  // Blocks until the operation completed on this rank (its output tensors
  // hold the result), or failed. May be called again: the same outcome.
  virtual absl::Status Wait() = 0;
  // Orders work queued next on the compute stream (the device's current
  // stream) after this operation without blocking the host, where the
  // backend can (NCCL: the compute stream waits on the operation's event);
  // elsewhere it waits as Wait() does. An error here is the operation's;
  // OK means only "ordered": Wait() still tells how it ended, and enforces
  // the timeout (aborting the communicator of a lost peer).
  virtual absl::Status OrderComputeAfter() { return Wait(); }
};

enum class ReduceOp { kSum, kMin, kMax };

class Collective {
 public:
  // The library a group runs on. (A job spec's `backend: auto` is resolved
  // to one of these before a group is made: worker/allreduce_setup.cc.)
  enum class Backend { kGloo, kNccl };

  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Backend backend() const = 0;
  // In place: every rank's `tensor` becomes the reduction of all ranks'.
  virtual std::unique_ptr<CollectiveWork> AllReduce(at::Tensor tensor, ReduceOp op = ReduceOp::kSum) = 0;
  // In place: every rank's `tensor` becomes `root`'s.
  virtual std::unique_ptr<CollectiveWork> Broadcast(at::Tensor tensor, int root) = 0;
  // outputs[r] receives rank r's `input` (size() outputs, each shaped like it).
  virtual std::unique_ptr<CollectiveWork> AllGather(std::vector<at::Tensor> outputs, at::Tensor input) = 0;
  virtual std::unique_ptr<CollectiveWork> Barrier() = 0;
  // Point-to-point (pipeline stages): `tensor` to rank `dst`; from rank
  // `src` into `tensor`, which must have the sent tensor's shape and dtype.
  // Matched by (peer, tag); a Send completes without waiting for its Recv.
  // Gloo only for now: NCCL's fail with UNIMPLEMENTED. Pure, like the rest:
  // a non-inline virtual here would put Collective's vtable in collective.cc
  // alone, which the NCCL plugin cannot see (it would no longer load).
  virtual std::unique_ptr<CollectiveWork> Send(at::Tensor tensor, int dst, int tag) = 0;
  virtual std::unique_ptr<CollectiveWork> Recv(at::Tensor tensor, int src, int tag) = 0;
};

struct CollectiveOptions {
  int rank = 0;
  int size = 1;
  std::shared_ptr<KeyValueStore> store;
  std::string prefix;  // namespace of this group's keys in the store
  // Longest any operation (and the rendezvous) may take before it fails.
  absl::Duration timeout = absl::Seconds(60);
  // gloo: the address the other ranks reach this one at (empty: this host's
  // name, as torch does).
  std::string hostname;
  // gloo: or the network interface to use (GLOO_SOCKET_IFNAME), if set.
  std::string interface;
  // gloo: threads running operations (torch's default is 2), and tensors
  // of at least gloo_split_bytes reduced as that many concurrent parts.
  int gloo_threads = 4;
  int64_t gloo_split_bytes = 8 << 20;
  int gloo_split_parts = 4;
  // nccl: the CUDA device of this rank (LOCAL_RANK).
  int device = 0;
};

// "gloo" or "nccl", for logs and messages.
const char* Name(Collective::Backend backend);

absl::StatusOr<std::unique_ptr<Collective>> CreateCollective(Collective::Backend backend,
                                                             const CollectiveOptions& options);

// Whether this build has the NCCL backend, and how many CUDA devices the
// machine shows (an error where there is no driver or device).
bool NcclBuilt();
absl::StatusOr<int> CudaDeviceCount();

}  // namespace pstrain

#endif  // PSTRAIN_COLLECTIVE_COLLECTIVE_H_
