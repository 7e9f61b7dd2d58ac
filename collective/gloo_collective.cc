// The "gloo" backend: c10d::ProcessGroupGloo (LibTorch, over Debian's
// libgloo), the implementation PyTorch DDP uses on CPUs, plus the adapters
// between our KeyValueStore and c10d::Store.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "collective/collective.h"
#include "collective/collective_internal.h"
#include "common/torch_compat.h"

namespace pstrain {
namespace {

std::chrono::milliseconds Millis(absl::Duration d) { return std::chrono::milliseconds(absl::ToInt64Milliseconds(d)); }

// c10d::Store over a KeyValueStore, for ProcessGroupGloo's rendezvous.
// c10d reports failures as exceptions.
class StoreAdapter : public c10d::Store {
 public:
  StoreAdapter(std::shared_ptr<KeyValueStore> kv, std::string prefix) : kv_(std::move(kv)), prefix_(std::move(prefix)) {}

#if PSTRAIN_C10D_STORE_HAS_CLONE
  // Our KeyValueStores are thread-safe: a clone shares the same one.
  c10::intrusive_ptr<c10d::Store> clone() override {
    auto copy = c10::make_intrusive<StoreAdapter>(kv_, prefix_);
    copy->setTimeout(timeout_);
    return copy;
  }
#endif

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Check(kv_->Set(prefix_ + key, std::string(value.begin(), value.end())));
  }
  std::vector<uint8_t> compareSet(const std::string&, const std::vector<uint8_t>&,
                                  const std::vector<uint8_t>&) override {
    throw std::runtime_error("compareSet is not supported by the pstrain rendezvous store");
  }
  std::vector<uint8_t> get(const std::string& key) override {
    auto v = kv_->Get(prefix_ + key, absl::Milliseconds(timeout_.count()));
    Check(v.status());
    return std::vector<uint8_t>(v->begin(), v->end());
  }
  int64_t add(const std::string& key, int64_t value) override {
    auto v = kv_->Add(prefix_ + key, value);
    Check(v.status());
    return *v;
  }
  bool deleteKey(const std::string&) override { return false; }
  bool check(const std::vector<std::string>& keys) override {
    for (const auto& k : keys) {
      if (!kv_->Get(prefix_ + k, absl::ZeroDuration()).ok()) return false;
    }
    return true;
  }
  int64_t getNumKeys() override { throw std::runtime_error("getNumKeys is not supported by the pstrain rendezvous store"); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    for (const auto& k : keys) Check(kv_->Get(prefix_ + k, absl::Milliseconds(timeout.count())).status());
  }

 private:
  static void Check(const absl::Status& s) {
    if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  }
  std::shared_ptr<KeyValueStore> kv_;
  std::string prefix_;
};

// KeyValueStore over c10d::TCPStore (torchrun's MASTER_ADDR:MASTER_PORT).
class TcpKeyValueStore : public KeyValueStore {
 public:
  explicit TcpKeyValueStore(c10::intrusive_ptr<c10d::TCPStore> store) : store_(std::move(store)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    try {
      store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("rendezvous store: ", e.what()));
    }
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    try {
      store_->wait({key}, Millis(std::max(timeout, absl::Milliseconds(1))));
      std::vector<uint8_t> v = store_->get(key);
      return std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      return absl::DeadlineExceededError(absl::StrCat("rendezvous store: key '", key, "': ", e.what()));
    }
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    try {
      return store_->add(key, delta);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("rendezvous store: ", e.what()));
    }
  }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

class GlooWork : public CollectiveWork {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, absl::Duration timeout, const char* what)
      : work_(std::move(work)), timeout_(timeout), what_(what) {}
  explicit GlooWork(absl::Status error) : error_(std::move(error)) {}
  absl::Status Wait() override {
    if (!error_.ok()) return error_;
    try {
      if (!work_->wait(Millis(timeout_))) {
        return absl::DeadlineExceededError(absl::StrCat(what_, " did not complete within ", absl::FormatDuration(timeout_)));
      }
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return PeerError(what_, e.what());
    }
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  absl::Duration timeout_;
  const char* what_ = "";
  absl::Status error_;
};

c10d::ReduceOp ToC10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kSum: break;
  }
  return c10d::ReduceOp::SUM;
}

class GlooCollective : public Collective {
 public:
  GlooCollective(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, const CollectiveOptions& options)
      : pg_(std::move(pg)), options_(options), timeout_(options.timeout) {}
  int rank() const override { return pg_->getRank(); }
  int size() const override { return pg_->getSize(); }
  Backend backend() const override { return Backend::kGloo; }

  std::unique_ptr<CollectiveWork> AllReduce(at::Tensor tensor, ReduceOp op) override {
    // Large tensors go as several concurrent all-reduces on the group's
    // threads: transfers of one part overlap the reduction of another
    // (measured: 5-20% more bus bandwidth at 16-256 MB, bench/README.md).
    const int64_t split = options_.gloo_split_parts;
    if (split > 1 && static_cast<int64_t>(tensor.nbytes()) >= options_.gloo_split_bytes && tensor.is_contiguous()) {
      at::Tensor flat = tensor.view({-1});
      const int64_t n = flat.numel();
      std::vector<std::unique_ptr<CollectiveWork>> parts;
      for (int64_t i = 0; i < split; ++i) {
        const int64_t a = n * i / split, b = n * (i + 1) / split;
        parts.push_back(AllReduce(flat.narrow(0, a, b - a), op));
      }
      struct Multi : CollectiveWork {
        std::vector<std::unique_ptr<CollectiveWork>> parts;
        absl::Status Wait() override {
          absl::Status first;
          for (auto& p : parts) {
            absl::Status s = p->Wait();
            if (!s.ok() && first.ok()) first = s;
          }
          return first;
        }
      };
      auto m = std::make_unique<Multi>();
      m->parts = std::move(parts);
      return m;
    }
    return Run("all-reduce", {tensor}, [&] {
      std::vector<at::Tensor> v{tensor};
      c10d::AllreduceOptions o;
      o.reduceOp = ToC10d(op);
      return pg_->allreduce(v, o);
    });
  }
  std::unique_ptr<CollectiveWork> Broadcast(at::Tensor tensor, int root) override {
    return Run("broadcast", {tensor}, [&] {
      std::vector<at::Tensor> v{tensor};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      return pg_->broadcast(v, o);
    });
  }
  std::unique_ptr<CollectiveWork> AllGather(std::vector<at::Tensor> outputs, at::Tensor input) override {
    if (static_cast<int>(outputs.size()) != size()) {
      return std::make_unique<GlooWork>(absl::InvalidArgumentError(
          absl::StrCat("all-gather: ", outputs.size(), " outputs for a group of ", size())));
    }
    for (const at::Tensor& o : outputs) {
      if (o.defined() && input.defined() && (o.sizes() != input.sizes() || o.scalar_type() != input.scalar_type())) {
        return std::make_unique<GlooWork>(
            absl::InvalidArgumentError("all-gather: every output must have the input's shape and dtype"));
      }
    }
    std::vector<at::Tensor> all = outputs;
    all.push_back(input);
    return Run("all-gather", all, [&] {
      std::vector<std::vector<at::Tensor>> out{outputs};
      std::vector<at::Tensor> in{input};
      return pg_->allgather(out, in);
    });
  }
  std::unique_ptr<CollectiveWork> Barrier() override {
    return Run("barrier", {}, [&] { return pg_->barrier(); });
  }
  std::unique_ptr<CollectiveWork> Send(at::Tensor tensor, int dst, int tag) override {
    if (dst < 0 || dst >= size() || dst == rank() || tag < 0) {
      return std::make_unique<GlooWork>(absl::InvalidArgumentError(
          absl::StrCat("send: rank ", dst, " (tag ", tag, ") from rank ", rank(), " of ", size())));
    }
    return Run("send", {tensor}, [&] {
      std::vector<at::Tensor> v{tensor};
      return pg_->send(v, dst, tag);
    });
  }
  std::unique_ptr<CollectiveWork> Recv(at::Tensor tensor, int src, int tag) override {
    if (src < 0 || src >= size() || src == rank() || tag < 0) {
      return std::make_unique<GlooWork>(absl::InvalidArgumentError(
          absl::StrCat("receive: rank ", src, " (tag ", tag, ") at rank ", rank(), " of ", size())));
    }
    return Run("receive", {tensor}, [&] {
      std::vector<at::Tensor> v{tensor};
      return pg_->recv(v, src, tag);
    });
  }

 private:
  // The caller's mistakes (INVALID_ARGUMENT, the job's fault) are told
  // apart from a broken group (UNAVAILABLE: a peer left, the job may resume
  // from its checkpoint) by checking the arguments before c10d sees them:
  // whatever c10d throws after that is the group's.
  template <typename F>
  std::unique_ptr<CollectiveWork> Run(const char* what, const std::vector<at::Tensor>& tensors, F start) {
    for (const at::Tensor& t : tensors) {
      if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous() || t.is_sparse()) {
        return std::make_unique<GlooWork>(absl::InvalidArgumentError(
            absl::StrCat(what, ": Gloo takes defined, dense, contiguous CPU tensors")));
      }
      switch (t.scalar_type()) {
        case at::kFloat:
        case at::kDouble:
        case at::kHalf:
        case at::kBFloat16:
        case at::kInt:
        case at::kLong:
        case at::kChar:
        case at::kByte:
          break;
        default:
          return std::make_unique<GlooWork>(absl::InvalidArgumentError(
              absl::StrCat(what, ": Gloo does not reduce ", c10::toString(t.scalar_type()), " tensors")));
      }
    }
    try {
      return std::make_unique<GlooWork>(start(), timeout_, what);
    } catch (const std::exception& e) {
      return std::make_unique<GlooWork>(PeerError(what, e.what()));
    }
  }
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  const CollectiveOptions options_;
  absl::Duration timeout_;
};

}  // namespace


absl::StatusOr<std::unique_ptr<Collective>> CreateGlooCollective(const CollectiveOptions& options) {
  try {
    auto store = c10::make_intrusive<StoreAdapter>(options.store, options.prefix);
    store->setTimeout(Millis(options.timeout));
    auto o = c10d::ProcessGroupGloo::Options::create(Millis(options.timeout));
    o->devices.push_back(!options.interface.empty()
                             ? c10d::ProcessGroupGloo::createDeviceForInterface(options.interface)
                         : options.hostname.empty()
                             ? c10d::ProcessGroupGloo::createDefaultDevice()
                             : c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname));
    o->threads = std::max(1, options.gloo_threads);
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, options.rank, options.size, o);
    return std::unique_ptr<Collective>(new GlooCollective(pg, options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo rendezvous of rank ", options.rank, " of ", options.size,
                                               " failed: ", std::string(e.what()).substr(0, 400)));
  }
}

absl::StatusOr<std::shared_ptr<KeyValueStore>> ConnectTcpStore(const std::string& host, int port, bool serve,
                                                               int world_size, absl::Duration timeout) {
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(port);
    o.isServer = serve;
    o.numWorkers = world_size;
    o.waitWorkers = true;
    o.timeout = Millis(timeout);
    UseClassicTcpStore(o);
    auto store = c10::make_intrusive<c10d::TCPStore>(host, o);
    return std::shared_ptr<KeyValueStore>(new TcpKeyValueStore(store));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rendezvous at ", host, ":", port, (serve ? " (serving)" : ""),
                                               " failed: ", std::string(e.what()).substr(0, 400)));
  }
}

}  // namespace pstrain
