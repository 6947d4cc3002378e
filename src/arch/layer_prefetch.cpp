#include "headwise/arch/layer_prefetch.hpp"

#include <ATen/core/grad_mode.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>

#ifdef HEADWISE_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include "headwise/arch/model.hpp"
#include "headwise/io/checkpoint.hpp"

namespace headwise::arch {
namespace {

size_t page_size() {
  static const size_t size = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

// Reads one byte per page: the page faults (and any disk reads) happen here, not later on the
// compute thread. Volatile reads: the compiler cannot drop them.
void touch_pages(std::span<const std::byte> bytes) {
  if (bytes.empty()) return;
  const auto* begin = reinterpret_cast<const volatile unsigned char*>(bytes.data());
  unsigned char sink = 0;
  for (size_t off = 0; off < bytes.size(); off += page_size()) sink ^= begin[off];
  sink ^= begin[bytes.size() - 1];
  // Atomic: several models (eval --jobs) prefetch on threads of their own at once.
  static std::atomic<unsigned char> keep;
  keep.store(sink, std::memory_order_relaxed);
}

// Asks the kernel to start reading the pages in (the touch below then waits on fewer faults).
void advise_willneed(std::span<const std::byte> bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(bytes.data());
  const uintptr_t first = begin & ~(uintptr_t{page_size()} - 1);
  ::madvise(reinterpret_cast<void*>(first), begin + bytes.size() - first, MADV_WILLNEED);
}

}  // namespace

struct LayerPrefetcher::Job {
  int64_t layer = -1;
  std::future<std::map<std::string, at::Tensor>> result;
#ifdef HEADWISE_WITH_CUDA
  std::shared_ptr<at::cuda::CUDAEvent> ready = std::make_shared<at::cuda::CUDAEvent>();
#endif
};

LayerPrefetcher::LayerPrefetcher(std::shared_ptr<const io::Checkpoint> checkpoint,
                                 at::Device device)
    : checkpoint_(std::move(checkpoint)), device_(device) {}

LayerPrefetcher::~LayerPrefetcher() {
  if (job_ && job_->result.valid()) job_->result.wait();
}

void LayerPrefetcher::start(int64_t layer, std::vector<PrefetchTensor> tensors) {
  if (job_) {
    if (job_->layer == layer) return;
    // One job at a time bounds the extra memory to one layer.
    if (job_->result.valid()) job_->result.wait();
    job_.reset();
  }
  auto job = std::make_unique<Job>();
  job->layer = layer;
  auto checkpoint = checkpoint_;
  const at::Device device = device_;
#ifdef HEADWISE_WITH_CUDA
  auto ready = job->ready;
#endif
  job->result = std::async(std::launch::async, [=]() {
    // Plain no-grad tensors, not inference tensors: the answer-grad measure back-propagates
    // through layers whose weights these are.
    const at::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> loaded;
    if (device.is_cpu()) {
      for (const auto& t : tensors) {
        const auto bytes = checkpoint->bytes(t.name);
        advise_willneed(bytes);
        touch_pages(bytes);
      }
      return loaded;
    }
#ifdef HEADWISE_WITH_CUDA
    const c10::cuda::CUDAGuard guard(device);
    const c10::cuda::CUDAStream side =
        c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    const c10::cuda::CUDAStreamGuard stream_guard(side);
    for (const auto& t : tensors) {
      const at::Tensor view = checkpoint_tensor(checkpoint, t.name);
      at::Tensor pinned = at::empty(view.sizes(), view.options().pinned_memory(true));
      pinned.copy_(view);
      // The host allocator keeps `pinned` alive until this asynchronous copy has run.
      at::Tensor on_device = pinned.to(device, /*non_blocking=*/true);
      loaded.emplace(t.name,
                     on_device.scalar_type() == t.target ? on_device : on_device.to(t.target));
    }
    ready->record(side);
#endif
    return loaded;
  });
  job_ = std::move(job);
}

bool LayerPrefetcher::pending(int64_t layer) const {
  return job_ && job_->layer == layer;
}

std::map<std::string, at::Tensor> LayerPrefetcher::take(int64_t layer) {
  if (!pending(layer)) return {};
  std::map<std::string, at::Tensor> loaded = job_->result.get();  // rethrows the thread's errors
#ifdef HEADWISE_WITH_CUDA
  if (!loaded.empty()) {
    const auto current = c10::cuda::getCurrentCUDAStream(device_.index());
    job_->ready->block(current);
    // The tensors were allocated on the side stream; tell the caching allocator the compute
    // stream uses them, so their memory is not reused before that work is done.
    for (auto& [name, t] : loaded) t.record_stream(current);
  }
#endif
  job_.reset();
  return loaded;
}

void drop_mapped_pages(std::span<const std::byte> bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(bytes.data());
  const uintptr_t page = page_size();
  const uintptr_t first = (begin + page - 1) & ~(page - 1);     // whole pages only: neighbours may
  const uintptr_t last = (begin + bytes.size()) & ~(page - 1);  // belong to other layers
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

}  // namespace headwise::arch
