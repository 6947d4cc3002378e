#include "headwise/calib/activations.hpp"

#include <spdlog/spdlog.h>

#ifdef HEADWISE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "headwise/calib/seqcalib.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"

namespace headwise::calib {

std::optional<int64_t> free_device_bytes(const at::Device& device) {
#ifdef HEADWISE_WITH_CUDA
  if (device.is_cuda()) {
    size_t free_bytes = 0, total = 0;
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device.has_index() ? device.index() : 0);
    const bool ok = cudaMemGetInfo(&free_bytes, &total) == cudaSuccess;
    cudaSetDevice(previous);
    if (ok) return static_cast<int64_t>(free_bytes);
  }
#endif
  return std::nullopt;
}

at::Tensor token_batch(const std::vector<std::vector<int64_t>>& sequences, size_t begin,
                       size_t end) {
  const auto steps = static_cast<int64_t>(sequences[begin].size());
  at::Tensor ids = at::empty({static_cast<int64_t>(end - begin), steps}, at::kLong);
  for (size_t i = begin; i < end; ++i) {
    if (static_cast<int64_t>(sequences[i].size()) != steps) {
      throw_input_error(
          "calibration: sequence {} has {} tokens, sequence 0 has {} (all must be equal)", i,
          sequences[i].size(), steps);
    }
    std::memcpy(ids[static_cast<int64_t>(i - begin)].data_ptr<int64_t>(), sequences[i].data(),
                static_cast<size_t>(steps) * sizeof(int64_t));
  }
  return ids;
}

ActivationStream::ActivationStream(arch::DecoderModel& model,
                                   const std::vector<std::vector<int64_t>>& sequences,
                                   int64_t micro_batch, ActivationPlacement placement)
    : model_(model) {
  // Empty for a rank whose shard has none of the probe's sequences: it still walks the layers.
  HEADWISE_CHECK(micro_batch > 0, "micro-batch of {}", micro_batch);
  const auto steps =
      sequences.empty() ? int64_t{0} : static_cast<int64_t>(sequences.front().size());
  const int64_t total = static_cast<int64_t>(sequences.size()) * steps * model.spec().hidden_size *
                        static_cast<int64_t>(c10::elementSize(model.dtype()));
  const auto free_bytes = free_device_bytes(model.device());
  switch (placement) {
    case ActivationPlacement::kDevice:
      on_device_ = true;
      break;
    case ActivationPlacement::kHost:
      on_device_ = model.device().is_cpu();
      break;
    case ActivationPlacement::kAuto:
      // Keep room for weights, workspace and the layer's output copy: at most 40% of what is free.
      on_device_ = model.device().is_cpu() || (free_bytes && total * 5 <= *free_bytes * 2);
      break;
  }
  if (!model.device().is_cpu()) {
    spdlog::info(
        "calibration activations: {} in {} memory{}", format_bytes(total),
        on_device_ ? "device" : "pinned host",
        free_bytes ? fmt::format(" ({} free on the device)", format_bytes(*free_bytes)) : "");
  }
  for (size_t begin = 0; begin < sequences.size(); begin += static_cast<size_t>(micro_batch)) {
    const size_t end = std::min(sequences.size(), begin + static_cast<size_t>(micro_batch));
    const at::Tensor ids = token_batch(sequences, begin, end).to(model.device());
    hidden_.push_back(to_storage(model.embed(ids)));
  }
}

at::Tensor ActivationStream::to_device(const at::Tensor& t) const {
  return t.device() == model_.device() ? t : t.to(model_.device(), /*non_blocking=*/true);
}

at::Tensor ActivationStream::to_storage(const at::Tensor& t) const {
  if (on_device_ || t.device().is_cpu()) return t;
  at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  host.copy_(t);
  return host;
}

void ActivationStream::apply(const std::function<at::Tensor(const at::Tensor&)>& fn) {
  for (auto& h : hidden_) h = to_storage(fn(to_device(h)));
}

void ActivationStream::visit(const std::function<void(const at::Tensor&)>& fn) {
  for (const auto& h : hidden_) fn(to_device(h));
}

std::vector<at::Tensor> ActivationStream::copy() const {
  std::vector<at::Tensor> out;
  for (const auto& h : hidden_) out.push_back(h.clone());
  return out;
}

void ActivationStream::assign(const std::vector<at::Tensor>& hidden) {
  HEADWISE_CHECK(hidden.size() == hidden_.size(), "activation stream: {} micro-batches for {}",
                 hidden.size(), hidden_.size());
  for (size_t m = 0; m < hidden.size(); ++m) {
    HEADWISE_CHECK(hidden[m].sizes() == hidden_[m].sizes(),
                   "activation stream: micro-batch {} is {}, not {}", m,
                   arch::shape_string(hidden[m].sizes()), arch::shape_string(hidden_[m].sizes()));
    hidden_[m] = hidden[m].clone();
  }
}

int64_t ActivationStream::bytes() const {
  int64_t total = 0;
  for (const auto& h : hidden_) total += static_cast<int64_t>(h.nbytes());
  return total;
}

}  // namespace headwise::calib
