// Qwen hybrid forward (qwen3_next, qwen3_5_text, qwen3_5 wrapper): parity with transformers'
// reference logits (tools/fixtures/qwen3_next.py, qwen3_5.py), chunked prefill through the
// decode state, checkpoint-layout variants and load errors.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/core/error.hpp"
#include "headwise/io/checkpoint.hpp"
#include "headwise/io/safetensors.hpp"

namespace fs = std::filesystem;
using namespace headwise;

namespace {

fs::path fixture(const std::string& name) { return fs::path(HEADWISE_FIXTURES_DIR) / name; }

at::Tensor reference(const std::string& name, const std::string& tensor) {
  auto file = io::SafetensorsFile::open(fixture(name) / "reference.safetensors");
  const auto& info = file->tensors().at(tensor);
  auto bytes = file->bytes(info);
  return at::from_blob(bytes.data(), info.shape, at::TensorOptions().dtype(arch::to_scalar_type(info.dtype))).clone();
}

double max_abs_error(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>();
}
double logit_scale(const at::Tensor& ref) { return std::max(1.0, ref.abs().max().item<double>()); }

// A fresh temp dir per test, removed at the end.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / fmt::format("headwise-qwen-{}-{}", tag, ::getpid());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}
void write_json(const fs::path& p, const nlohmann::json& j) { std::ofstream(p) << j.dump(2); }

// Rewrites a fixture's weights: `rename` maps a name to its new name ("" drops it); `extra`
// adds tensors. Tensors are written contiguous, in their own dtype.
void rewrite_weights(const std::string& name, const fs::path& out, const std::function<std::string(const std::string&)>& rename,
                     std::vector<std::pair<std::string, at::Tensor>> extra = {}) {
  auto ckpt = io::Checkpoint::open(fixture(name));
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& n : ckpt->tensor_names()) {
    const std::string renamed = rename(n);
    if (!renamed.empty()) tensors.emplace_back(renamed, arch::checkpoint_tensor(ckpt, n).contiguous());
  }
  for (auto& e : extra) tensors.emplace_back(e.first, e.second.contiguous());
  std::vector<io::TensorToWrite> to_write;
  for (const auto& [n, t] : tensors) {
    to_write.push_back({n, arch::from_scalar_type(t.scalar_type()), t.sizes().vec(),
                        std::span<const std::byte>(static_cast<const std::byte*>(t.data_ptr()), t.nbytes())});
  }
  io::write_safetensors(out / "model.safetensors", to_write);
}

at::Tensor run_fixture(const fs::path& dir, const at::Tensor& ids, std::optional<DType> dtype = std::nullopt) {
  arch::ModelOptions options;
  options.compute_dtype = dtype;
  auto model = arch::load_model(dir, options);
  return model->forward(ids);
}

const char* const kFixtures[] = {"qwen3_next_tiny", "qwen3_next_tiny_b", "qwen3_5_text_tiny", "qwen3_5_text_tiny_b"};

}  // namespace

TEST_CASE("qwen hybrid fp32 logits match transformers", "[parity]") {
  for (const std::string name : kFixtures) {
    SECTION(name) {
      const at::Tensor ids = reference(name, "input_ids");
      const at::Tensor ref = reference(name, "logits_fp32");
      const at::Tensor got = run_fixture(fixture(name), ids);
      REQUIRE(got.sizes() == ref.sizes());
      const double err = max_abs_error(got, ref), scale = logit_scale(ref);
      INFO(name << ": fp32 max abs error " << err << ", logit scale " << scale);
      CHECK(err <= 1e-4 * scale);
    }
  }
}

// bf16: both sides round every activation to bf16 in the same op order; what differs is how
// CPU kernels accumulate inside matmuls and reductions, which can flip the last bit of a
// logit. Measured max |error| (scale = max|logit| of the reference): qwen3_next_tiny 0.0039
// (scale 1), qwen3_next_tiny_b 0.0020 (1), qwen3_5_text_tiny 0.0039 (1), qwen3_5_text_tiny_b
// 0.0078 (1.48) — at most one bf16 ulp (2^-7 relative) of the logit scale. Tolerance: two ulps.
TEST_CASE("qwen hybrid bf16 logits match transformers", "[parity]") {
  for (const std::string name : kFixtures) {
    SECTION(name) {
      const at::Tensor ids = reference(name, "input_ids");
      const at::Tensor ref = reference(name, "logits_bf16");
      const at::Tensor got = run_fixture(fixture(name), ids, DType::kBFloat16);
      const double err = max_abs_error(got, ref), scale = logit_scale(ref);
      INFO(name << ": bf16 max abs error " << err << ", logit scale " << scale);
      CHECK(err <= std::ldexp(1.0, -6) * scale);
    }
  }
}
