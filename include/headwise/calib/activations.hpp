#pragma once
// The calibration batch's hidden states between layers, split into micro-batches. They live
// on the device when they fit (no transfers) and in pinned host memory when not (one H2D and
// one D2H copy per micro-batch per layer); the choice is logged and reported.
#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "headwise/arch/model.hpp"

namespace headwise::calib {

enum class ActivationPlacement;

class ActivationStream {
 public:
  ActivationStream(arch::DecoderModel& model, const std::vector<std::vector<int64_t>>& sequences,
                   int64_t micro_batch, ActivationPlacement placement);

  int64_t micro_batches() const { return static_cast<int64_t>(hidden_.size()); }
  // Replaces every micro-batch's hidden states by fn(hidden) (run on the model's device).
  void apply(const std::function<at::Tensor(const at::Tensor&)>& fn);
  // Runs fn on every micro-batch without replacing it.
  void visit(const std::function<void(const at::Tensor&)>& fn);
  std::string placement_name() const { return on_device_ ? "device" : "host"; }
  // A copy of every micro-batch's hidden states (where they live), and putting such a copy back.
  std::vector<at::Tensor> copy() const;
  void assign(const std::vector<at::Tensor>& hidden);
  int64_t bytes() const;

 private:
  at::Tensor to_device(const at::Tensor& t) const;
  at::Tensor to_storage(const at::Tensor& t) const;

  arch::DecoderModel& model_;
  bool on_device_ = true;
  std::vector<at::Tensor> hidden_;  // [micro_batch, T, H] each
};

// Sequences [begin, end) as a [end - begin, T] int64 CPU tensor; InputError when their lengths
// differ. The stream's micro-batches are consecutive runs of these.
at::Tensor token_batch(const std::vector<std::vector<int64_t>>& sequences, size_t begin,
                       size_t end);

// Free bytes on a CUDA device (nullopt for CPU or without CUDA support).
std::optional<int64_t> free_device_bytes(const at::Device& device);

}  // namespace headwise::calib
