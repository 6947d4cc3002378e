#pragma once
// The memory a calibration run will need, said before it starts (llm-compressor #3011 is the
// lesson): one layer's weights, the calibration activations, and the attention workspace.
#include <cstdint>
#include <optional>
#include <string>

#include "headwise/arch/model_spec.hpp"

namespace headwise::io {
class Checkpoint;
}

namespace headwise::calib {

struct CalibrationShape {
  int64_t samples = 0;
  int64_t seq_len = 0;
  int64_t micro_batch = 1;
  int64_t attention_chunk = 512;
  int64_t levels = 5;
  int64_t compute_element_size = 4;
};

struct MemoryPlan {
  int64_t largest_layer_weight_bytes = 0;
  int64_t embedding_weight_bytes = 0;
  int64_t activation_bytes = 0;  // all calibration hidden states
  int64_t micro_batch_bytes = 0;  // one micro-batch's hidden states and layer intermediates
  int64_t workspace_bytes = 0;    // attention scores and multi-window partials of one chunk
  std::optional<int64_t> available_bytes;
  bool activations_on_device = true;

  int64_t device_peak_bytes() const;
  std::string describe() const;
};

MemoryPlan plan_calibration_memory(const arch::ModelSpec& spec, const io::Checkpoint& checkpoint,
                                   const CalibrationShape& shape, bool on_device, std::optional<int64_t> available);

// MemAvailable of /proc/meminfo, or nullopt.
std::optional<int64_t> available_host_bytes();

}  // namespace headwise::calib
