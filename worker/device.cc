#include "worker/device.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/isfinite.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/cuda.h>

#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "table/tensor_buffer.h"

namespace pstrain {

int CudaDevices() {
  try {
    return static_cast<int>(torch::cuda::device_count());
  } catch (const std::exception&) {
    return 0;
  }
}

absl::StatusOr<c10::Device> ResolveDevice(DeviceChoice spec_device, const std::string& worker_device,
                                          int local_rank) {
  if (spec_device == DeviceChoice::kCpu) return c10::Device(c10::kCPU);
  if (worker_device == "cpu") {
    if (spec_device == DeviceChoice::kCuda) {
      return absl::FailedPreconditionError("the job asks for device: cuda, but this worker runs with --device=cpu");
    }
    return c10::Device(c10::kCPU);
  }
  const int n = CudaDevices();
  if (n == 0) {
    if (spec_device == DeviceChoice::kCuda || !worker_device.empty()) {
      return absl::FailedPreconditionError(
          "device cuda: this worker sees no CUDA device (a LibTorch without CUDA, no driver, or no GPU); "
          "use device: auto or cpu");
    }
    return c10::Device(c10::kCPU);
  }
  int index = local_rank >= 0 ? local_rank % n : 0;
  if (!worker_device.empty() && worker_device != "cuda") {
    int i = -1;
    if (!absl::StartsWith(worker_device, "cuda:") || !absl::SimpleAtoi(worker_device.substr(5), &i) || i < 0 ||
        i >= n) {
      return absl::InvalidArgumentError(absl::StrCat("--device=", Quote(worker_device, 32),
                                                     ": expected cpu, cuda or cuda:N with N < ", n));
    }
    index = i;
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

bool HostAllFinite(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "HostAllFinite: a tensor on ", t.device().str());
  if (t.is_contiguous() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble)) {
    return AllFinite(t.scalar_type() == at::kFloat ? DT_FLOAT32 : DT_FLOAT64,
                     static_cast<const uint8_t*>(t.data_ptr()), t.nbytes());
  }
  if (!at::isFloatingType(t.scalar_type())) return true;
  return at::isfinite(t).all().item<bool>();
}

at::Tensor HostBufferFor(const at::Tensor& like, const c10::Device& device) {
  return at::empty(like.sizes(), like.options().device(c10::kCPU).pinned_memory(!device.is_cpu()));
}

DeviceStager::DeviceStager(c10::Device device) : device_(device) {
  if (on_host()) return;
  c10::impl::VirtualGuardImpl impl(device_.type());
  copy_stream_ = impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
  thread_ = std::thread([this] { Loop(); });
}

DeviceStager::~DeviceStager() {
  if (!thread_.joinable()) return;
  Drain();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

at::Tensor DeviceStager::Copy(const at::Tensor& src, const at::Tensor& dst) {
  if (on_host()) return src;
  c10::impl::VirtualGuardImpl impl(device_.type());
  // The copy may start only once the compute stream produced `src`.
  c10::Event produced(device_.type());
  produced.record(impl.getStream(device_));
  produced.block(*copy_stream_);
  {
    c10::StreamGuard guard(*copy_stream_);
    dst.copy_(src, /*non_blocking=*/true);
  }
  // `src` may be freed by the caller before the copy ran: tell the caching
  // allocator that the copy stream still uses its memory.
  impl.recordDataPtrOnStream(src.storage().data_ptr(), *copy_stream_);
  return dst;
}

void DeviceStager::Then(std::function<void()> fn) {
  if (on_host()) {
    fn();
    return;
  }
  auto landed = std::make_unique<c10::Event>(device_.type());
  landed->record(*copy_stream_);
  absl::MutexLock lock(&mu_);
  queue_.emplace_back(std::move(landed), std::move(fn));
}

void DeviceStager::Drain() {
  if (on_host()) return;
  absl::MutexLock lock(&mu_);
  const auto idle = [this] { return queue_.empty() && running_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

void DeviceStager::Upload(const at::Tensor& src, const at::Tensor& dst) { dst.copy_(src, /*non_blocking=*/true); }

namespace {

// c10::Event has no blocking wait in every LibTorch version: poll it (what
// is waited for takes tens of microseconds to milliseconds).
void WaitFor(const c10::Event& event) {
  for (int spins = 0; !event.query(); ++spins) {
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

}  // namespace

DeferredScalar::DeferredScalar(const at::Tensor& value) {
  if (value.device().is_cpu()) {
    host_ = value;
    return;
  }
  host_ = at::empty({}, value.options().device(c10::kCPU).pinned_memory(true));
  host_.copy_(value.reshape({}), /*non_blocking=*/true);
  c10::impl::VirtualGuardImpl impl(value.device().type());
  copied_ = std::make_shared<c10::Event>(value.device().type());
  copied_->record(impl.getStream(value.device()));
}

double DeferredScalar::Value() const {
  if (copied_ != nullptr) WaitFor(*copied_);
  return host_.item<double>();
}

void DeviceStager::Loop() {
  while (true) {
    std::pair<std::unique_ptr<c10::Event>, std::function<void()>> item;
    {
      absl::MutexLock lock(&mu_);
      const auto ready = [this] { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping
      item = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    // Unlocked: Then and Drain go on while the copy lands and the
    // continuation runs.
    WaitFor(*item.first);
    item.second();
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace pstrain
