#include "headwise/calib/memory_plan.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "headwise/core/units.hpp"
#include "headwise/io/checkpoint.hpp"

namespace headwise::calib {

namespace fs = std::filesystem;

namespace {

std::optional<int64_t> meminfo_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t value = 0;
  std::string unit;
  while (meminfo >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return std::nullopt;
}

std::optional<int64_t> read_integer_file(const fs::path& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  try {
    return std::stoll(word);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<int64_t> stat_field(const fs::path& path, std::string_view field) {
  std::ifstream in(path);
  std::string key;
  int64_t value = 0;
  while (in >> key >> value) {
    if (key == field) return value;
  }
  return std::nullopt;
}

// A cgroup's folder: the path /proc/self/cgroup names, under the controller's mount, or the
// mount itself when a container's namespace shows its own cgroup as "/".
fs::path cgroup_folder(const fs::path& mount, const std::string& path) {
  std::error_code ec;
  const fs::path named = mount / fs::path(path).relative_path();
  return fs::exists(named, ec) ? named : mount;
}

}  // namespace

int64_t answer_span_cache_bytes(const arch::ModelSpec& spec, const CalibrationShape& shape) {
  const int64_t e = shape.compute_element_size;
  int64_t per_sequence = 0;
  for (const auto& layer : spec.layers) {
    if (layer.attention) {
      const auto& a = *layer.attention;
      const int64_t tokens =
          a.sliding_window > 0 ? std::min(a.sliding_window, shape.seq_len) : shape.seq_len;
      per_sequence += 2 * tokens * a.num_kv_heads * a.head_dim * e;
    }
    for (const auto& state : layer.states) {
      int64_t numel = 1;
      for (int64_t d : state.shape) numel *= d;
      per_sequence += numel * std::max<int64_t>(e, 4);  // recurrent states are kept in fp32
    }
  }
  return shape.samples * per_sequence;
}

std::optional<CgroupMemory> cgroup_memory_from(const fs::path& proc_self_cgroup,
                                               const fs::path& sys_fs_cgroup) {
  std::ifstream in(proc_self_cgroup);
  std::string line;
  while (std::getline(in, line)) {
    // hierarchy-ID:controllers:path; cgroup v2 is "0::path", v1's memory hierarchy lists "memory".
    const auto first = line.find(':');
    const auto second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    std::optional<CgroupMemory> found;
    if (controllers.empty()) {
      const fs::path dir = cgroup_folder(sys_fs_cgroup, path);
      if (const auto limit = read_integer_file(dir / "memory.max")) {
        found = CgroupMemory{*limit, stat_field(dir / "memory.stat", "anon").value_or(0)};
      }
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      const fs::path dir = cgroup_folder(sys_fs_cgroup / "memory", path);
      const auto limit = read_integer_file(dir / "memory.limit_in_bytes");
      // v1 reports "no limit" as a page-rounded LONG_MAX.
      if (limit && *limit < (int64_t{1} << 60)) {
        found = CgroupMemory{*limit, stat_field(dir / "memory.stat", "total_rss").value_or(0)};
      }
    }
    if (found) return found;
  }
  return std::nullopt;
}

std::optional<int64_t> available_host_bytes() {
  auto available = meminfo_available_bytes();
  // In a container or under systemd's MemoryMax the cgroup's limit, not the machine's free
  // memory, is what the kernel enforces; its page cache (mapped weights) can be reclaimed, so
  // only the anonymous memory already charged counts as used.
  if (const auto cgroup = cgroup_memory_from("/proc/self/cgroup", "/sys/fs/cgroup")) {
    const int64_t headroom = std::max<int64_t>(0, cgroup->limit_bytes - cgroup->anonymous_bytes);
    available = available ? std::min(*available, headroom) : headroom;
  }
  return available;
}

int64_t MemoryPlan::device_peak_bytes() const {
  const int64_t activations =
      activations_on_device ? activation_bytes + stream_checkpoint_bytes : 0;
  const int64_t measured = measured_layer_resident ? measured_layer_weight_bytes : 0;
  return largest_layer_weight_bytes + measured + embedding_weight_bytes + activations +
         micro_batch_bytes + workspace_bytes + answer_span_cache_bytes;
}

nlohmann::json MemoryPlan::to_json() const {
  nlohmann::json out{{"planned_peak_bytes", device_peak_bytes()},
                     {"largest_layer_bytes", largest_layer_weight_bytes},
                     {"measured_layer_bytes", measured_layer_weight_bytes},
                     {"measured_layer_resident", measured_layer_resident},
                     {"embedding_bytes", embedding_weight_bytes},
                     {"activation_bytes", activation_bytes},
                     {"activations_on_device", activations_on_device},
                     {"micro_batch_bytes", micro_batch_bytes},
                     {"attention_workspace_bytes", workspace_bytes},
                     {"answer_span_cache_bytes", answer_span_cache_bytes},
                     {"stream_checkpoint_bytes", stream_checkpoint_bytes},
                     {"mapped_weight_bytes", mapped_weight_bytes}};
  out["available_bytes"] =
      available_bytes ? nlohmann::json(*available_bytes) : nlohmann::json(nullptr);
  return out;
}

std::string MemoryPlan::describe() const {
  const std::string span =
      answer_span_cache_bytes > 0
          ? fmt::format(" + answer-span caches {}", format_bytes(answer_span_cache_bytes))
          : "";
  std::string measured;
  if (measured_layer_weight_bytes > 0) {
    measured = measured_layer_resident
                   ? fmt::format(" + measured layer {}", format_bytes(measured_layer_weight_bytes))
                   : fmt::format(
                         " (the measured layer's {} released during its sweeps: two "
                         "layers do not fit)",
                         format_bytes(measured_layer_weight_bytes));
  }
  return fmt::format(
      "planned peak {} = largest layer {}{} + embeddings {} + activations {} and stream "
      "checkpoints {} ({}) + "
      "micro-batch {} + attention workspace {}{}; plus up to {} of mapped checkpoint pages (page "
      "cache, "
      "reclaimable){}",
      format_bytes(device_peak_bytes()), format_bytes(largest_layer_weight_bytes), measured,
      format_bytes(embedding_weight_bytes), format_bytes(activation_bytes),
      format_bytes(stream_checkpoint_bytes),
      activations_on_device ? "on the device" : "in host memory", format_bytes(micro_batch_bytes),
      format_bytes(workspace_bytes), span, format_bytes(mapped_weight_bytes),
      available_bytes ? fmt::format("; {} available", format_bytes(*available_bytes)) : "");
}

namespace {

// Keeping the measured layer resident saves one load of each global layer's weights: worth it
// only while it fits. (When even one layer does not fit, the refusal names the smaller need.)
void release_measured_layer_unless_it_fits(MemoryPlan& plan) {
  plan.measured_layer_resident =
      !plan.available_bytes || plan.device_peak_bytes() <= *plan.available_bytes;
}

}  // namespace

MemoryPlan plan_calibration_memory(const arch::ModelSpec& spec, const io::Checkpoint& checkpoint,
                                   const CalibrationShape& shape, bool on_device,
                                   std::optional<int64_t> available) {
  MemoryPlan plan;
  plan.activations_on_device = on_device;
  plan.available_bytes = available;
  // Weights are streamed per layer, converted to the compute dtype on load.
  static const std::regex kLayerIndex(R"((?:^|\.)layers\.(\d+)\.)");
  struct LayerBytes {
    int64_t converted = 0;  // in the compute dtype
    int64_t stored = 0;     // as mapped from the checkpoint
  };
  std::map<int64_t, LayerBytes> per_layer;
  for (const auto& name : checkpoint.tensor_names()) {
    const auto& info = checkpoint.info(name);
    const int64_t bytes = info.numel() * shape.compute_element_size;
    std::smatch match;
    if (std::regex_search(name, match, kLayerIndex)) {
      LayerBytes& layer = per_layer[std::stoll(match[1].str())];
      layer.converted += bytes;
      layer.stored += info.nbytes();
    } else {
      plan.embedding_weight_bytes += bytes;
    }
  }
  int64_t largest_stored = 0;
  for (const auto& [index, layer] : per_layer) {
    plan.largest_layer_weight_bytes = std::max(plan.largest_layer_weight_bytes, layer.converted);
    largest_stored = std::max(largest_stored, layer.stored);
  }
  plan.mapped_weight_bytes = 2 * largest_stored;
  int64_t widest_heads = 1;
  for (const auto& layer : spec.layers) {
    if (layer.attention) widest_heads = std::max(widest_heads, layer.attention->num_heads);
  }
  const int64_t e = shape.compute_element_size;
  plan.activation_bytes = shape.samples * shape.seq_len * spec.hidden_size * e;
  // Input, output and a few same-sized intermediates of a layer (norms, projections, MLP).
  plan.micro_batch_bytes = 6 * shape.micro_batch * shape.seq_len * spec.hidden_size * e;
  // fp32 scores, probabilities and masks of one query chunk against all keys, plus per-level
  // outputs. 4.5 score-sized buffers per key is what the runs used (tools/bench-seqlen.sh and
  // the planner test: 3.9 with block-mse, 4.3-4.5 with answer-kl, whose references and
  // windowed reruns overlap the measurement's); docs/performance.md has the figures.
  const int64_t chunk = std::min(shape.attention_chunk, shape.seq_len);
  plan.workspace_bytes = shape.micro_batch * widest_heads * chunk *
                         (9 * shape.seq_len / 2 + 2 * shape.levels * 256) * 4;
  const int64_t global_layers = static_cast<int64_t>(spec.global_layer_ids().size());
  plan.stream_checkpoint_bytes =
      std::min(shape.stream_checkpoint_limit_bytes, global_layers * plan.activation_bytes);
  if (shape.answer_span) {
    plan.answer_span_cache_bytes = answer_span_cache_bytes(spec, shape);
    for (int64_t id : spec.global_layer_ids()) {
      const auto it = per_layer.find(id);
      if (it != per_layer.end())
        plan.measured_layer_weight_bytes =
            std::max(plan.measured_layer_weight_bytes, it->second.converted);
    }
    release_measured_layer_unless_it_fits(plan);
  }
  return plan;
}

}  // namespace headwise::calib
