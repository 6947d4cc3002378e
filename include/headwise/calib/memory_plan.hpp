#pragma once
// The memory a calibration run will need, said before it starts (llm-compressor #3011 is the
// lesson): one layer's weights, the calibration activations, and the attention workspace.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
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
  // The answer-span measures keep every layer's cache of the calibration batch before the span
  // (answer_span.hpp); the conditioned walk keeps copies of its stream for re-walks.
  bool answer_span = false;
  int64_t stream_checkpoint_limit_bytes = 0;
};

struct MemoryPlan {
  int64_t largest_layer_weight_bytes = 0;
  // Answer-span measures: the measured global layer stays converted while its candidates run
  // through the layers above (the walk decides a layer inside its own pass), so a second layer's
  // weights are resident beside the one streaming: the largest global layer's. When that second
  // layer does not fit what is available and the rest does, the plan releases it instead
  // (measured_layer_resident false): the walk then captures, sweeps and runs each global layer in
  // separate passes and loads its weights once more, and the peak counts one layer.
  int64_t measured_layer_weight_bytes = 0;
  bool measured_layer_resident = true;
  int64_t embedding_weight_bytes = 0;
  int64_t activation_bytes = 0;   // all calibration hidden states
  int64_t micro_batch_bytes = 0;  // one micro-batch's hidden states and layer intermediates
  int64_t workspace_bytes = 0;    // attention scores and multi-window partials of one chunk
  // Answer-span measures: every attention layer's K/V before the span (a sliding layer's window of
  // them) and every recurrent/convolution state at its start, for all calibration sequences; an
  // upper bound (the span starts before the last token).
  int64_t answer_span_cache_bytes = 0;
  int64_t stream_checkpoint_bytes = 0;  // the walk's kept streams, with the activations
  // Host memory, outside the peak: the mapped checkpoint pages of the layer being converted and of
  // the one being prefetched. They are page cache, which the kernel reclaims (and the loader
  // drops) under a memory limit, so they are resident when memory is free and cost nothing
  // when it is not.
  int64_t mapped_weight_bytes = 0;
  std::optional<int64_t> available_bytes;
  bool activations_on_device = true;

  int64_t device_peak_bytes() const;
  std::string describe() const;
  // The components and the total, in bytes, for the report.
  nlohmann::json to_json() const;
};

MemoryPlan plan_calibration_memory(const arch::ModelSpec& spec, const io::Checkpoint& checkpoint,
                                   const CalibrationShape& shape, bool on_device,
                                   std::optional<int64_t> available);

// The answer-span caches of `shape.samples` sequences (an upper bound: the whole sequence before
// the span), in the compute dtype, as AnswerSpan keeps them.
int64_t answer_span_cache_bytes(const arch::ModelSpec& spec, const CalibrationShape& shape);

// Host memory this process may still use: MemAvailable of /proc/meminfo, lowered to the memory
// cgroup's headroom (limit minus anonymous memory charged) when a limit is set; nullopt if unknown.
std::optional<int64_t> available_host_bytes();

struct CgroupMemory {
  int64_t limit_bytes = 0;
  int64_t anonymous_bytes = 0;
};

// The memory limit of this process's cgroup (v2 memory.max or v1 memory.limit_in_bytes), read
// from the given /proc/self/cgroup and /sys/fs/cgroup (parameters so tests can pass fakes);
// nullopt when no limit is set.
std::optional<CgroupMemory> cgroup_memory_from(const std::filesystem::path& proc_self_cgroup,
                                               const std::filesystem::path& sys_fs_cgroup);

}  // namespace headwise::calib
