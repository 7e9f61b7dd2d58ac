// The "nccl" backend: NCCL on CUDA tensors, one communicator and one CUDA
// stream per group; rank 0's ncclUniqueId goes through the rendezvous
// store. Built when @cuda found a toolkit with NCCL (HAVE_NCCL), as the
// plugin libpstrain_nccl.so, which the worker loads only when a job asks
// for NCCL: the binaries themselves never need the CUDA libraries to start.
// It needs no CUDA build of LibTorch to compile (tensors are only read for
// their device pointers), but a CUDA build to create CUDA tensors.
#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "collective/collective.h"
#include "collective/collective_internal.h"

namespace pstrain {
namespace {

absl::Status CudaError(const char* what, cudaError_t e) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

absl::StatusOr<ncclDataType_t> NcclType(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default: break;
  }
  return absl::InvalidArgumentError(absl::StrCat("nccl: unsupported dtype ", c10::toString(t.scalar_type())));
}

absl::Status CheckTensor(const at::Tensor& t) {
  if (!t.defined() || !t.is_cuda()) return absl::InvalidArgumentError("nccl: tensors must be CUDA tensors");
  if (!t.is_contiguous()) return absl::InvalidArgumentError("nccl: tensors must be contiguous");
  return NcclType(t).status();
}

// The group's communicator, shared by the group and its pending works:
// whoever finds a peer gone aborts it (once; ncclCommAbort frees it, so it
// is never destroyed after), and every later operation fails at once.
class Communicator {
 public:
  explicit Communicator(ncclComm_t comm) : comm_(comm) {}
  ~Communicator() {
    if (!aborted_) ncclCommDestroy(comm_);
  }
  // Queues `op(comm)` (NCCL calls on the communicator), unless it was
  // aborted: never at the same time as an abort frees it.
  template <typename Op>
  absl::Status Call(const char* what, Op op) {
    absl::MutexLock lock(&mu_);
    if (aborted_) return abort_reason_;
    ncclResult_t r = op(comm_);
    if (r != ncclSuccess) return PeerError(what, ncclGetErrorString(r));
    return absl::OkStatus();
  }
  // The communicator's asynchronous error (a peer gone, a network error);
  // after an abort, the reason it was aborted.
  absl::Status AsyncError(const char* what) {
    absl::MutexLock lock(&mu_);
    if (aborted_) return abort_reason_;
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess) return PeerError(what, ncclGetErrorString(async));
    return absl::OkStatus();
  }
  // Unblocks every NCCL kernel of this communicator still waiting for a
  // peer (their streams go on; their outputs are garbage).
  void Abort(absl::Status reason) {
    absl::MutexLock lock(&mu_);
    if (aborted_) return;
    ncclCommAbort(comm_);
    aborted_ = true;
    abort_reason_ = absl::UnavailableError(
        absl::StrCat("the NCCL communicator was aborted after an earlier failure: ", reason.message()));
  }
  absl::Status Aborted() {
    absl::MutexLock lock(&mu_);
    return aborted_ ? abort_reason_ : absl::OkStatus();
  }

 private:
  absl::Mutex mu_;
  const ncclComm_t comm_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status abort_reason_ ABSL_GUARDED_BY(mu_);
};

// Completion of the work queued on the group's stream so far.
class NcclWork : public CollectiveWork {
 public:
  NcclWork(cudaEvent_t event, std::shared_ptr<Communicator> comm, int device, absl::Duration timeout, const char* what)
      : event_(event), comm_(std::move(comm)), device_(device), timeout_(timeout), what_(what) {}
  explicit NcclWork(absl::Status error) : error_(std::move(error)) {}
  ~NcclWork() override {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  absl::Status Wait() override {
    if (!error_.ok()) return error_;
    const absl::Time deadline = absl::Now() + timeout_;
    while (true) {
      cudaError_t e = cudaEventQuery(event_);
      if (e == cudaSuccess) {
        // An aborted communicator lets its kernels finish with garbage.
        return comm_->Aborted();
      }
      if (e != cudaErrorNotReady) return CudaError(what_, e);
      if (absl::Status s = comm_->AsyncError(what_); !s.ok()) {
        comm_->Abort(s);
        return s;
      }
      if (absl::Now() > deadline) {
        absl::Status s = absl::DeadlineExceededError(
            absl::StrCat(what_, " did not complete within ", absl::FormatDuration(timeout_), " (a peer left?)"));
        comm_->Abort(s);  // a peer is gone: unblock the stream
        return s;
      }
      absl::SleepFor(absl::Microseconds(50));
    }
  }
  absl::Status OrderComputeAfter() override {
    if (!error_.ok()) return error_;
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) return CudaError(what_, e);
    // The compute stream is the device's default stream (see
    // NcclCollective::OrderAfterCompute).
    if (cudaError_t e = cudaStreamWaitEvent(cudaStreamLegacy, event_, 0); e != cudaSuccess) return CudaError(what_, e);
    return absl::OkStatus();
  }

 private:
  cudaEvent_t event_ = nullptr;
  std::shared_ptr<Communicator> comm_;
  int device_ = 0;
  absl::Duration timeout_;
  const char* what_ = "";
  absl::Status error_;
};

class NcclCollective : public Collective {
 public:
  NcclCollective(ncclComm_t comm, cudaStream_t stream, int rank, int size, int device, absl::Duration timeout)
      : comm_(std::make_shared<Communicator>(comm)),
        stream_(stream),
        rank_(rank),
        size_(size),
        device_(device),
        timeout_(timeout) {}
  ~NcclCollective() override {
    if (produced_ != nullptr) cudaEventDestroy(produced_);
    // Works still held elsewhere keep the communicator; the stream goes
    // once its queued work is done (cudaStreamDestroy does not wait).
    comm_.reset();
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::kNccl; }

  std::unique_ptr<CollectiveWork> AllReduce(at::Tensor t, ReduceOp op) override {
    if (absl::Status s = CheckTensor(t); !s.ok()) return Fail(s);
    const ncclRedOp_t nop = op == ReduceOp::kMin ? ncclMin : op == ReduceOp::kMax ? ncclMax : ncclSum;
    return Enqueue("all-reduce", [&](ncclComm_t c) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), *NcclType(t), nop, c, stream_);
    });
  }
  std::unique_ptr<CollectiveWork> Broadcast(at::Tensor t, int root) override {
    if (absl::Status s = CheckTensor(t); !s.ok()) return Fail(s);
    return Enqueue("broadcast", [&](ncclComm_t c) {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), *NcclType(t), root, c, stream_);
    });
  }
  std::unique_ptr<CollectiveWork> AllGather(std::vector<at::Tensor> outputs, at::Tensor input) override {
    if (absl::Status s = CheckTensor(input); !s.ok()) return Fail(s);
    if (static_cast<int>(outputs.size()) != size_) return Fail(absl::InvalidArgumentError("all-gather: one output per rank"));
    // Gather into one buffer, then copy each rank's part out.
    void* buffer = nullptr;
    const size_t bytes = input.nbytes();
    absl::MutexLock lock(&mu_);
    if (absl::Status s = OrderAfterCompute("all-gather"); !s.ok()) return Fail(s);
    if (cudaError_t e = cudaMallocAsync(&buffer, bytes * size_, stream_); e != cudaSuccess) {
      return Fail(CudaError("all-gather", e));
    }
    absl::Status r = comm_->Call("all-gather", [&](ncclComm_t c) {
      return ncclAllGather(input.data_ptr(), buffer, input.numel(), *NcclType(input), c, stream_);
    });
    for (int i = 0; r.ok() && i < size_; ++i) {
      cudaMemcpyAsync(outputs[i].data_ptr(), static_cast<char*>(buffer) + i * bytes, bytes, cudaMemcpyDeviceToDevice,
                      stream_);
    }
    cudaFreeAsync(buffer, stream_);
    return Record("all-gather", r);
  }
  std::unique_ptr<CollectiveWork> Barrier() override {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = OrderAfterCompute("barrier"); !s.ok()) return Fail(s);
    if (barrier_ == nullptr && cudaMallocAsync(&barrier_, sizeof(float), stream_) != cudaSuccess) {
      return Fail(absl::FailedPreconditionError("barrier: cannot allocate"));
    }
    return Record("barrier", comm_->Call("barrier", [&](ncclComm_t c) {
      return ncclAllReduce(barrier_, barrier_, 1, ncclFloat32, ncclSum, c, stream_);
    }));
  }
  // Not yet: NCCL matches point-to-point calls by order, not tag, and one
  // stream per group would deadlock 1F1B's crossing sends (the pipeline
  // runs on Gloo).
  std::unique_ptr<CollectiveWork> Send(at::Tensor, int, int) override {
    return Fail(absl::UnimplementedError("point-to-point send is not built for nccl (pipeline stages use gloo)"));
  }
  std::unique_ptr<CollectiveWork> Recv(at::Tensor, int, int) override {
    return Fail(absl::UnimplementedError("point-to-point receive is not built for nccl (pipeline stages use gloo)"));
  }

 private:
  static std::unique_ptr<CollectiveWork> Fail(absl::Status s) { return std::make_unique<NcclWork>(std::move(s)); }
  // Runs `op(comm)` (which queues NCCL work on stream_) after everything LibTorch
  // queued so far on the device's default stream, where the trainer
  // computes: an event orders the two streams, nothing blocks the host.
  template <typename Op>
  std::unique_ptr<CollectiveWork> Enqueue(const char* what, Op op) {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = OrderAfterCompute(what); !s.ok()) return Fail(s);
    return Record(what, comm_->Call(what, op));
  }
  absl::Status OrderAfterCompute(const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (absl::Status s = comm_->Aborted(); !s.ok()) return s;
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) return CudaError(what, e);
    if (produced_ == nullptr) {
      if (cudaError_t e = cudaEventCreateWithFlags(&produced_, cudaEventDisableTiming); e != cudaSuccess) {
        return CudaError(what, e);
      }
    }
    cudaEventRecord(produced_, cudaStreamLegacy);
    if (cudaError_t e = cudaStreamWaitEvent(stream_, produced_, 0); e != cudaSuccess) return CudaError(what, e);
    return absl::OkStatus();
  }
  // `queued`: how queueing the operation went.
  std::unique_ptr<CollectiveWork> Record(const char* what, absl::Status queued) {
    if (!queued.ok()) return Fail(std::move(queued));
    cudaEvent_t event = nullptr;
    if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming); e != cudaSuccess) {
      return Fail(CudaError(what, e));
    }
    cudaEventRecord(event, stream_);
    return std::make_unique<NcclWork>(event, comm_, device_, timeout_, what);
  }

  // Queues one operation at a time on stream_, ordered after the compute
  // stream by produced_.
  absl::Mutex mu_;
  std::shared_ptr<Communicator> comm_;
  cudaStream_t stream_;
  int rank_, size_, device_;
  absl::Duration timeout_;
  void* barrier_ ABSL_GUARDED_BY(mu_) = nullptr;
  cudaEvent_t produced_ ABSL_GUARDED_BY(mu_) = nullptr;  // recorded on the default stream before each operation
};

}  // namespace

absl::StatusOr<int> DeviceCount() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return CudaError("no CUDA device", e);
  return n;
}

absl::StatusOr<std::unique_ptr<Collective>> CreateNccl(const CollectiveOptions& options) {
  auto devices = DeviceCount();
  if (!devices.ok()) return devices.status();
  if (options.device < 0 || options.device >= *devices) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", options.device, " does not exist (", *devices, " found)"));
  }
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) return CudaError("cudaSetDevice", e);
  ncclUniqueId id;
  const std::string key = options.prefix + "nccl_unique_id";
  if (options.rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return PeerError("ncclGetUniqueId", ncclGetErrorString(r));
    absl::Status s = options.store->Set(key, absl::Base64Escape(absl::string_view(id.internal, sizeof(id.internal))));
    if (!s.ok()) return s;
  } else {
    auto v = options.store->Get(key, options.timeout);
    if (!v.ok()) return v.status();
    std::string raw;
    if (!absl::Base64Unescape(*v, &raw) || raw.size() != sizeof(id.internal)) {
      return absl::DataLossError("the NCCL unique id in the rendezvous store is malformed");
    }
    std::memcpy(id.internal, raw.data(), raw.size());
  }
  ncclComm_t comm;
  if (ncclResult_t r = ncclCommInitRank(&comm, options.size, id, options.rank); r != ncclSuccess) {
    return PeerError("ncclCommInitRank", ncclGetErrorString(r));
  }
  cudaStream_t stream;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    ncclCommDestroy(comm);
    return CudaError("cudaStreamCreate", e);
  }
  return std::unique_ptr<Collective>(
      new NcclCollective(comm, stream, options.rank, options.size, options.device, options.timeout));
}

}  // namespace pstrain

extern "C" __attribute__((visibility("default"))) pstrain::Collective* PstrainNcclCreate(
    const pstrain::CollectiveOptions* options, std::string* error) {
  auto c = pstrain::CreateNccl(*options);
  if (!c.ok()) {
    *error = c.status().ToString();
    return nullptr;
  }
  return c->release();
}

extern "C" __attribute__((visibility("default"))) int PstrainCudaDeviceCount(std::string* error) {
  auto n = pstrain::DeviceCount();
  if (!n.ok()) {
    *error = std::string(n.status().message());
    return -1;
  }
  return *n;
}
