#pragma once
// Shared helpers for tests that build model specs from tests/configs/*.json.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "headwise/arch/registry.hpp"
#include "headwise/core/files.hpp"
#include "support/test_paths.hpp"

namespace headwise::testing {

inline std::filesystem::path config_dir() {
  return std::filesystem::path(HEADWISE_SOURCE_DIR) / "tests" / "configs";
}

inline arch::ModelSpec spec_from_config(const std::string& file) {
  const auto path = config_dir() / file;
  return arch::build_model_spec(read_json_file(path), path.string());
}

// Every config in tests/configs whose model_type has a registered architecture.
inline std::vector<std::string> registered_configs() {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(config_dir())) {
    if (entry.path().extension() != ".json") continue;
    const auto text = arch::text_config_of(read_json_file(entry.path()), entry.path().string());
    if (arch::ArchitectureRegistry::instance().find(text.value("model_type", "")) != nullptr) {
      out.push_back(entry.path().filename().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace headwise::testing
