#pragma once
// The architecture table. Each architecture lives in one file under src/arch/ and registers
// itself with a static `RegisterArchitecture`; nothing else (calibration, memory, CLI) names
// architectures. Config-only entries (no `create_model`) still get exact memory estimates.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "headwise/arch/model_spec.hpp"
#include "headwise/core/dtype.hpp"

namespace headwise::io {
class Checkpoint;
}

namespace headwise::arch {

class DecoderModel;

struct ModelOptions {
  std::string device = "cpu";          // "cpu", "cuda", "cuda:1"
  std::optional<DType> compute_dtype;  // default: float32 on CPU, the checkpoint's dtype on CUDA
  int64_t attention_chunk = 512;       // queries per attention chunk: workspace O(chunk x T)
  // Host weights of at least this many bytes (converted) get their own anonymous mapping, returned
  // to the system when their layer is released (model.cpp says why).
  int64_t own_mapping_min_bytes = int64_t{1} << 20;
};

using SpecBuilder = std::function<ModelSpec(const ConfigReader& text_config)>;
using ModelFactory = std::function<std::unique_ptr<DecoderModel>(
    const ModelSpec& spec, std::shared_ptr<const io::Checkpoint> checkpoint,
    const ModelOptions& options)>;

struct Architecture {
  std::string name;                      // e.g. "qwen3_next"
  std::vector<std::string> model_types;  // text model types it handles
  SpecBuilder build_spec;
  ModelFactory create_model;  // empty: config-level support only (memory estimates)
};

class ArchitectureRegistry {
 public:
  static ArchitectureRegistry& instance();
  void add(Architecture architecture);
  const Architecture* find(std::string_view model_type) const;
  // Throws UnsupportedError listing the supported model types.
  const Architecture& get(std::string_view model_type, std::string_view where) const;
  std::vector<std::string> supported_model_types() const;     // sorted
  std::vector<std::string> model_types_with_forward() const;  // sorted
  const std::vector<Architecture>& all() const { return architectures_; }

 private:
  std::vector<Architecture> architectures_;
};

struct RegisterArchitecture {
  explicit RegisterArchitecture(Architecture architecture) {
    ArchitectureRegistry::instance().add(std::move(architecture));
  }
};

// Picks the language-model part of a config: multimodal wrappers (gemma3, qwen3_5) nest it
// under `text_config`; the wrapper's dtype is inherited when the text part has none.
nlohmann::json text_config_of(const nlohmann::json& config, std::string_view where);

// config.json → ModelSpec. `where` names the file in errors.
ModelSpec build_model_spec(const nlohmann::json& config, std::string_view where);
ModelSpec load_model_spec(const std::filesystem::path& model_dir);

// Opens the checkpoint, validates every tensor the architecture needs, returns the model.
std::unique_ptr<DecoderModel> load_model(const std::filesystem::path& model_dir,
                                         const ModelOptions& options);

}  // namespace headwise::arch
