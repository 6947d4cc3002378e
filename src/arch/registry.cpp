#include "headwise/arch/registry.hpp"

#include <algorithm>

#include "headwise/arch/model.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/io/checkpoint.hpp"

namespace headwise::arch {
namespace fs = std::filesystem;

ArchitectureRegistry& ArchitectureRegistry::instance() {
  static ArchitectureRegistry registry;
  return registry;
}

void ArchitectureRegistry::add(Architecture architecture) {
  for (const auto& type : architecture.model_types) {
    HEADWISE_CHECK(find(type) == nullptr, "model_type '{}' registered twice", type);
  }
  architectures_.push_back(std::move(architecture));
}

const Architecture* ArchitectureRegistry::find(std::string_view model_type) const {
  for (const auto& a : architectures_) {
    if (std::find(a.model_types.begin(), a.model_types.end(), model_type) != a.model_types.end())
      return &a;
  }
  return nullptr;
}

const Architecture& ArchitectureRegistry::get(std::string_view model_type,
                                              std::string_view where) const {
  if (const auto* a = find(model_type)) return *a;
  throw_unsupported("{}: model_type '{}' is not supported (supported: {})", where, model_type,
                    fmt::join(supported_model_types(), ", "));
}

std::vector<std::string> ArchitectureRegistry::supported_model_types() const {
  std::vector<std::string> types;
  for (const auto& a : architectures_)
    types.insert(types.end(), a.model_types.begin(), a.model_types.end());
  std::sort(types.begin(), types.end());
  return types;
}

std::vector<std::string> ArchitectureRegistry::model_types_with_forward() const {
  std::vector<std::string> types;
  for (const auto& a : architectures_) {
    if (a.create_model) types.insert(types.end(), a.model_types.begin(), a.model_types.end());
  }
  std::sort(types.begin(), types.end());
  return types;
}

nlohmann::json text_config_of(const nlohmann::json& config, std::string_view where) {
  if (!config.is_object()) throw_input_error("{}: expected a JSON object", where);
  const auto it = config.find("text_config");
  if (it == config.end() || it->is_null()) return config;
  if (!it->is_object()) throw_input_error("{}: field 'text_config' must be an object", where);
  nlohmann::json text = *it;
  for (const char* key : {"torch_dtype", "dtype", "tie_word_embeddings"}) {
    if (!text.contains(key) && config.contains(key)) text[key] = config[key];
  }
  if (!text.contains("model_type") && config.contains("model_type") &&
      config["model_type"].is_string()) {
    text["model_type"] = config["model_type"].get<std::string>() + "_text";
  }
  return text;
}

ModelSpec build_model_spec(const nlohmann::json& config, std::string_view where) {
  const nlohmann::json text = text_config_of(config, where);
  const ConfigReader reader(text, std::string(where));
  const std::string model_type = reader.get_string("model_type");
  const Architecture& architecture = ArchitectureRegistry::instance().get(model_type, where);
  ModelSpec spec = architecture.build_spec(reader);
  spec.model_type = model_type;
  spec.config_model_type = config.value("model_type", model_type);
  spec.config = config;
  spec.text_config = text;
  if (spec.hidden_size <= 0) spec.hidden_size = reader.get_positive_int("hidden_size");
  if (spec.vocab_size <= 0) spec.vocab_size = reader.get_positive_int("vocab_size");
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (reader.has(key) && reader.get(key).is_string() && reader.get_string(key) != "auto") {
      spec.dtype = parse_dtype(reader.get_string(key), fmt::format("{}: field '{}'", where, key));
      break;
    }
  }
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    HEADWISE_CHECK(spec.layers[i].id == static_cast<int64_t>(i),
                   "layer ids must be 0..N-1 in order");
    if (const auto& att = spec.layers[i].attention) {
      if (att->num_heads <= 0 || att->num_kv_heads <= 0 || att->head_dim <= 0 ||
          att->num_heads % att->num_kv_heads != 0) {
        throw_input_error("{}: layer {}: {} attention heads cannot be grouped over {} KV heads",
                          where, i, att->num_heads, att->num_kv_heads);
      }
    }
  }
  if (spec.layers.empty()) throw_input_error("{}: the model has no layers", where);
  return spec;
}

ModelSpec load_model_spec(const fs::path& model_dir) {
  const fs::path config_path = model_dir / "config.json";
  return build_model_spec(read_json_file(config_path), config_path.string());
}

std::unique_ptr<DecoderModel> load_model(const fs::path& model_dir, const ModelOptions& options) {
  ModelSpec spec = load_model_spec(model_dir);
  const Architecture& architecture =
      ArchitectureRegistry::instance().get(spec.model_type, (model_dir / "config.json").string());
  if (!architecture.create_model) {
    throw_unsupported(
        "{}: model_type '{}' has config-level support only (memory estimates); forward passes "
        "exist for: {}",
        (model_dir / "config.json").string(), spec.model_type,
        fmt::join(ArchitectureRegistry::instance().model_types_with_forward(), ", "));
  }
  auto checkpoint = io::Checkpoint::open(model_dir);
  auto model = architecture.create_model(spec, checkpoint, options);
  model->validate_weights();
  return model;
}

}  // namespace headwise::arch
