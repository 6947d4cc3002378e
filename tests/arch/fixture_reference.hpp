#pragma once
// Helpers for the parity tests: read a fixture's reference tensors, run the C++ forward on
// its input, and build modified copies of a fixture (config rewrites, renamed or reshaped
// tensors) in a temporary directory.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <unistd.h>
#include <nlohmann/json.hpp>
#include "../support/temp_dir.hpp"
#include "../support/test_paths.hpp"

#include <atomic>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/io/safetensors.hpp"
#include "headwise/memory/memory_model.hpp"

namespace headwise::testing {

inline std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(HEADWISE_FIXTURES_DIR) / name;
}

// A window for every KV head of every global layer: window(layer_id, head).
inline memory::HeadWindows windows_by_head(const arch::ModelSpec& spec,
                                           const std::function<int64_t(int64_t, int64_t)>& window) {
  memory::HeadWindows out;
  for (int64_t id : spec.global_layer_ids()) {
    for (int64_t h = 0; h < spec.layer(id).attention->num_kv_heads; ++h)
      out[id].push_back(window(id, h));
  }
  return out;
}

// A tensor of <dir>/reference.safetensors, copied out of the mapping.
inline at::Tensor read_reference(const std::filesystem::path& dir, const std::string& name) {
  const auto file = io::SafetensorsFile::open(dir / "reference.safetensors");
  const auto& info = file->tensors().at(name);
  const auto bytes = file->bytes(info);
  return at::from_blob(bytes.data(), info.shape,
                       at::TensorOptions().dtype(arch::to_scalar_type(info.dtype)))
      .clone();
}

inline double max_abs(const at::Tensor& t) {
  return t.abs().max().item<double>();
}
inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// The fixture's logits from the C++ model loaded from `model_dir` (default: the fixture).
inline at::Tensor run_fixture(
    const std::filesystem::path& fixture, const arch::ModelOptions& options,
    const std::optional<std::filesystem::path>& model_dir = std::nullopt) {
  auto model = arch::load_model(model_dir.value_or(fixture), options);
  return model->forward(read_reference(fixture, "input_ids"));
}

struct ParityError {
  double error = 0;  // max |ours - reference|
  double scale = 0;  // max(1, max |reference|): the fp32 bound is 1e-4 x scale
};

inline ParityError compare(const at::Tensor& ours, const at::Tensor& reference) {
  REQUIRE(ours.sizes() == reference.sizes());
  REQUIRE(ours.scalar_type() == at::kFloat);
  return {max_abs_diff(ours, reference), std::max(1.0, max_abs(reference))};
}

// The fixture's logits against transformers' own: fp32 within 1e-4 of the logit scale, bf16
// within one bf16 ulp of it (4e-3), as every family is held to.
inline void check_parity_fp32_bf16(const std::string& name) {
  const auto fixture = fixture_dir(name);
  const auto fp32 = compare(run_fixture(fixture, {}), read_reference(fixture, "logits_fp32"));
  INFO(name << ": fp32 max abs err " << fp32.error << ", logit scale " << fp32.scale);
  CHECK(fp32.error <= 1e-4 * fp32.scale);
  arch::ModelOptions options;
  options.compute_dtype = DType::kBFloat16;
  const auto bf16 = compare(run_fixture(fixture, options), read_reference(fixture, "logits_bf16"));
  INFO(name << ": bf16 max abs err " << bf16.error << ", logit scale " << bf16.scale);
  CHECK(bf16.error <= 4e-3 * bf16.scale);
}

using headwise::testing::TempDir;

// One tensor as it will be written: name, shape and bytes may all be changed.
struct EditableTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};

// Copies a fixture's checkpoint into `out` with its config passed through `edit_config` and
// every tensor through `edit_tensor` (return false to drop a tensor).
inline void copy_fixture(const std::filesystem::path& fixture, const std::filesystem::path& out,
                         const std::function<nlohmann::json(nlohmann::json)>& edit_config,
                         const std::function<bool(EditableTensor&)>& edit_tensor = {}) {
  const nlohmann::json config = edit_config(read_json_file(fixture / "config.json"));
  write_file_atomically(out / "config.json", config.dump(2));
  const auto file = io::SafetensorsFile::open(fixture / "model.safetensors");
  std::vector<EditableTensor> tensors;
  for (const auto& [name, info] : file->tensors()) {
    const auto bytes = file->bytes(info);
    EditableTensor t{name, info.dtype, info.shape,
                     std::vector<std::byte>(bytes.begin(), bytes.end())};
    if (!edit_tensor || edit_tensor(t)) tensors.push_back(std::move(t));
  }
  std::vector<io::TensorToWrite> to_write;
  for (const auto& t : tensors) to_write.push_back({t.name, t.dtype, t.shape, t.data});
  io::write_safetensors(out / "model.safetensors", to_write);
}

// The fixture's fp32 logits after its config and tensors pass through the edits, against
// transformers' reference for the unedited checkpoint: how far an edited feature moves them.
inline ParityError edited_fixture_error(
    const std::string& name, const std::function<nlohmann::json(nlohmann::json)>& edit_config,
    const std::function<bool(EditableTensor&)>& edit_tensor = {}) {
  const auto fixture = fixture_dir(name);
  TempDir dir;
  copy_fixture(fixture, dir.path(), edit_config, edit_tensor);
  return compare(run_fixture(fixture, {}, dir.path()), read_reference(fixture, "logits_fp32"));
}

// Zeroes every tensor whose name contains `part` (an edit_tensor for edited_fixture_error).
inline std::function<bool(EditableTensor&)> zero_tensors(const std::string& part) {
  return [part](EditableTensor& t) {
    if (t.name.find(part) != std::string::npos)
      std::fill(t.data.begin(), t.data.end(), std::byte{0});
    return true;
  };
}

inline nlohmann::json same_config(nlohmann::json c) {
  return c;
}

// Loading `dir` must fail with an InputError whose message contains every `needle`.
inline void require_load_error(const std::filesystem::path& dir,
                               const std::vector<std::string>& needles) {
  try {
    arch::load_model(dir, arch::ModelOptions{});
    FAIL("loading " << dir << " succeeded");
  } catch (const InputError& e) {
    const std::string message = e.what();
    INFO(message);
    for (const auto& needle : needles) CHECK(message.find(needle) != std::string::npos);
  }
}

}  // namespace headwise::testing
