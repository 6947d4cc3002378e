#include "headwise/calib/memory_plan.hpp"

#include <fstream>
#include <map>
#include <regex>

#include "headwise/core/units.hpp"
#include "headwise/io/checkpoint.hpp"

namespace headwise::calib {

std::optional<int64_t> available_host_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t value = 0;
  std::string unit;
  while (meminfo >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return std::nullopt;
}

int64_t MemoryPlan::device_peak_bytes() const {
  const int64_t activations = activations_on_device ? activation_bytes : 0;
  return largest_layer_weight_bytes + embedding_weight_bytes + activations + micro_batch_bytes + workspace_bytes;
}

std::string MemoryPlan::describe() const {
  return fmt::format("planned peak {} = largest layer {} + embeddings {} + activations {} ({}) + micro-batch {} + "
                     "attention workspace {}{}",
                     format_bytes(device_peak_bytes()), format_bytes(largest_layer_weight_bytes),
                     format_bytes(embedding_weight_bytes), format_bytes(activation_bytes),
                     activations_on_device ? "on the device" : "in host memory", format_bytes(micro_batch_bytes),
                     format_bytes(workspace_bytes),
                     available_bytes ? fmt::format("; {} available", format_bytes(*available_bytes)) : "");
}

MemoryPlan plan_calibration_memory(const arch::ModelSpec& spec, const io::Checkpoint& checkpoint,
                                   const CalibrationShape& shape, bool on_device, std::optional<int64_t> available) {
  MemoryPlan plan;
  plan.activations_on_device = on_device;
  plan.available_bytes = available;
  // Weights are streamed per layer, converted to the compute dtype on load.
  static const std::regex kLayerIndex(R"((?:^|\.)layers\.(\d+)\.)");
  std::map<int64_t, int64_t> per_layer;
  for (const auto& name : checkpoint.tensor_names()) {
    const auto& info = checkpoint.info(name);
    const int64_t bytes = info.numel() * shape.compute_element_size;
    std::smatch match;
    if (std::regex_search(name, match, kLayerIndex)) {
      per_layer[std::stoll(match[1].str())] += bytes;
    } else {
      plan.embedding_weight_bytes += bytes;
    }
  }
  for (const auto& [layer, bytes] : per_layer) plan.largest_layer_weight_bytes = std::max(plan.largest_layer_weight_bytes, bytes);
  int64_t widest_heads = 1;
  for (const auto& layer : spec.layers) {
    if (layer.attention) widest_heads = std::max(widest_heads, layer.attention->num_heads);
  }
  const int64_t e = shape.compute_element_size;
  plan.activation_bytes = shape.samples * shape.seq_len * spec.hidden_size * e;
  // Input, output and a few same-sized intermediates of a layer (norms, projections, MLP).
  plan.micro_batch_bytes = 6 * shape.micro_batch * shape.seq_len * spec.hidden_size * e;
  // fp32 scores/probabilities of one query chunk against all keys, plus per-level outputs.
  const int64_t chunk = std::min(shape.attention_chunk, shape.seq_len);
  plan.workspace_bytes = shape.micro_batch * widest_heads * chunk * (3 * shape.seq_len + 2 * shape.levels * 256) * 4;
  return plan;
}

}  // namespace headwise::calib
