// Qwen hybrid forward (qwen3_next, qwen3_5_text, qwen3_5 wrapper): parity with transformers'
// reference logits (tools/fixtures/qwen3_next.py, qwen3_5.py), chunked prefill through the
// decode state, checkpoint-layout variants and load errors.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <dirent.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include "../support/temp_dir.hpp"
#include "../support/test_paths.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
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

fs::path fixture(const std::string& name) {
  return fs::path(HEADWISE_FIXTURES_DIR) / name;
}

at::Tensor reference(const std::string& name, const std::string& tensor) {
  auto file = io::SafetensorsFile::open(fixture(name) / "reference.safetensors");
  const auto& info = file->tensors().at(tensor);
  auto bytes = file->bytes(info);
  return at::from_blob(bytes.data(), info.shape,
                       at::TensorOptions().dtype(arch::to_scalar_type(info.dtype)))
      .clone();
}

double max_abs_error(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>();
}
double logit_scale(const at::Tensor& ref) {
  return std::max(1.0, ref.abs().max().item<double>());
}

using headwise::testing::TempDir;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}
void write_json(const fs::path& p, const nlohmann::json& j) {
  std::ofstream(p) << j.dump(2);
}

// Rewrites a fixture's weights: `rename` maps a name to its new name ("" drops it); `extra`
// adds tensors. Tensors are written contiguous, in their own dtype.
void rewrite_weights(const std::string& name, const fs::path& out,
                     const std::function<std::string(const std::string&)>& rename,
                     std::vector<std::pair<std::string, at::Tensor>> extra = {}) {
  auto ckpt = io::Checkpoint::open(fixture(name));
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& n : ckpt->tensor_names()) {
    const std::string renamed = rename(n);
    if (!renamed.empty())
      tensors.emplace_back(renamed, arch::checkpoint_tensor(ckpt, n).contiguous());
  }
  for (auto& e : extra) tensors.emplace_back(e.first, e.second.contiguous());
  std::vector<io::TensorToWrite> to_write;
  for (const auto& [n, t] : tensors) {
    to_write.push_back(
        {n, arch::from_scalar_type(t.scalar_type()), t.sizes().vec(),
         std::span<const std::byte>(static_cast<const std::byte*>(t.data_ptr()), t.nbytes())});
  }
  io::write_safetensors(out / "model.safetensors", to_write);
}

at::Tensor run_fixture(const fs::path& dir, const at::Tensor& ids,
                       std::optional<DType> dtype = std::nullopt) {
  arch::ModelOptions options;
  options.compute_dtype = dtype;
  auto model = arch::load_model(dir, options);
  return model->forward(ids);
}

const char* const kFixtures[] = {"qwen3_next_tiny",  "qwen3_next_tiny_b", "qwen3_next_yarn",
                                 "qwen3_5_moe_tiny", "qwen3_5_text_tiny", "qwen3_5_text_tiny_b"};

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

namespace {

// Keeps each full-attention layer's K/V across calls, as the grouped-cache runtime will:
// causal attention of the new queries over everything seen so far (HF eager numerics).
class CachingAttention final : public arch::AttentionCore {
 public:
  at::Tensor attend(const arch::AttentionInputs& in) override {
    auto& [k_all, v_all] = cache_[in.layer_id];
    k_all = k_all.defined() ? at::cat({k_all, in.k}, 2) : in.k;
    v_all = v_all.defined() ? at::cat({v_all, in.v}, 2) : in.v;
    const int64_t steps = in.q.size(2), total = k_all.size(2), group = in.q.size(1) / in.k.size(1);
    REQUIRE(total == in.position_offset + steps);
    const at::Tensor k = k_all.repeat_interleave(group, 1), v = v_all.repeat_interleave(group, 1);
    const auto opts = at::TensorOptions().dtype(at::kLong);
    const at::Tensor q_pos = at::arange(in.position_offset, total, opts).view({steps, 1});
    const at::Tensor future = at::arange(0, total, opts).view({1, total}) > q_pos;
    const at::Tensor scores = (at::matmul(in.q, k.transpose(-1, -2)) * in.scaling).to(at::kFloat);
    const at::Tensor probs =
        at::softmax(scores.masked_fill(future, -INFINITY), -1).to(v.scalar_type());
    return at::matmul(probs, v).transpose(1, 2);  // [B, T, nh, hd]
  }

 private:
  std::map<int64_t, std::pair<at::Tensor, at::Tensor>> cache_;
};

// Runs ids through the per-layer API in consecutive chunks of the given lengths, carrying the
// linear layers' state and the attention K/V; returns the logits of all tokens.
at::Tensor run_in_chunks(arch::DecoderModel& model, const at::Tensor& ids,
                         const std::vector<int64_t>& lengths,
                         std::vector<arch::LayerState>& states) {
  CachingAttention attention;
  std::vector<at::Tensor> logits;
  int64_t offset = 0;
  for (int64_t len : lengths) {
    at::Tensor h = model.embed(ids.slice(1, offset, offset + len));
    for (int64_t i = 0; i < model.spec().num_layers(); ++i) {
      arch::LayerRun run;
      run.attention = &attention;
      run.state = &states[static_cast<size_t>(i)];
      run.position_offset = offset;
      h = model.run_layer(i, h, run);
    }
    logits.push_back(model.logits(h));
    offset += len;
  }
  REQUIRE(offset == ids.size(1));
  return at::cat(logits, 1);
}

}  // namespace

TEST_CASE("qwen hybrid chunked prefill and decode through the layer state equal one pass",
          "[arch]") {
  for (const std::string name : {"qwen3_next_tiny", "qwen3_5_text_tiny_b"}) {
    auto model = arch::load_model(fixture(name), {});
    const at::Tensor ids = reference(name, "input_ids");
    const at::Tensor whole = model->forward(ids);
    // 70+26: chunked rule continuing from a state mid-chunk; 2+...: conv state shorter than K
    // (zero-padded), single-token steps take the recurrent rule.
    for (const auto& lengths :
         std::vector<std::vector<int64_t>>{{70, 26}, {2, 1, 64, 28, 1}, {95, 1}}) {
      SECTION(fmt::format("{} {}", name, fmt::join(lengths, "+"))) {
        std::vector<arch::LayerState> states(static_cast<size_t>(model->spec().num_layers()));
        const at::Tensor chunked = run_in_chunks(*model, ids, lengths, states);
        CHECK(max_abs_error(chunked, whole) <= 1e-5 * logit_scale(whole));
        // The states are those the spec declares (batch first), conv in the compute dtype.
        for (const auto& layer : model->spec().layers) {
          const auto& state = states[static_cast<size_t>(layer.id)];
          REQUIRE(state.size() == layer.states.size());
          for (const auto& s : layer.states) {
            std::vector<int64_t> shape{ids.size(0)};
            shape.insert(shape.end(), s.shape.begin(), s.shape.end());
            CHECK(state.at(s.name).sizes().vec() == shape);
            CHECK(state.at(s.name).scalar_type() ==
                  (s.name == "conv_state" ? model->dtype() : at::kFloat));
          }
        }
      }
    }
  }
}

TEST_CASE("qwen hybrid writes final states into preallocated buffers", "[arch]") {
  auto model = arch::load_model(fixture("qwen3_next_tiny"), {});
  const at::Tensor ids = reference("qwen3_next_tiny", "input_ids");
  const at::Tensor whole = model->forward(ids);
  // Zero buffers are the fresh-sequence state; the runtime allocates them once per layer.
  std::vector<arch::LayerState> states(static_cast<size_t>(model->spec().num_layers()));
  std::map<std::string, void*> addresses;
  for (const auto& layer : model->spec().layers) {
    for (const auto& s : layer.states) {
      std::vector<int64_t> shape{ids.size(0)};
      shape.insert(shape.end(), s.shape.begin(), s.shape.end());
      auto& t = states[static_cast<size_t>(layer.id)][s.name];
      t = at::zeros(shape, at::TensorOptions().dtype(arch::to_scalar_type(s.dtype)));
      addresses[fmt::format("{}/{}", layer.id, s.name)] = t.data_ptr();
    }
  }
  const at::Tensor chunked = run_in_chunks(*model, ids, {40, 56}, states);
  CHECK(max_abs_error(chunked, whole) <= 1e-5 * logit_scale(whole));
  for (const auto& layer : model->spec().layers) {
    for (const auto& s : layer.states) {
      const auto& t = states[static_cast<size_t>(layer.id)].at(s.name);
      CHECK(t.data_ptr() == addresses.at(fmt::format("{}/{}", layer.id, s.name)));
      CHECK(t.abs().sum().item<double>() > 0);
    }
  }
}

TEST_CASE("qwen hybrid rejects a layer state of the wrong shape", "[arch]") {
  auto model = arch::load_model(fixture("qwen3_next_tiny"), {});
  const at::Tensor ids = reference("qwen3_next_tiny", "input_ids").slice(1, 0, 8);
  arch::LayerState state{{"recurrent_state", at::zeros({2, 4, 16, 9})}};
  arch::LayerRun run;
  run.state = &state;
  REQUIRE_THROWS_WITH(model->run_layer(0, model->embed(ids), run),
                      Catch::Contains("recurrent_state") && Catch::Contains("[2, 4, 16, 8]"));
}

TEST_CASE("qwen3_next YaRN is applied: the same weights with default RoPE give other logits",
          "[parity]") {
  const std::string name = "qwen3_next_yarn";
  TempDir dir("yarn");
  nlohmann::json config = read_json(fixture(name) / "config.json");
  config["rope_parameters"] = {
      {"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.5}};
  write_json(dir.path() / "config.json", config);
  fs::copy_file(fixture(name) / "model.safetensors", dir.path() / "model.safetensors");
  const at::Tensor ids = reference(name, "input_ids");
  const at::Tensor ref = reference(name, "logits_fp32");
  CHECK(max_abs_error(run_fixture(dir.path(), ids), ref) > 1e-3 * ref.abs().max().item<double>());
}

TEST_CASE("qwen3_5 and qwen3_5_moe wrapper checkpoints give the text model's logits", "[arch]") {
  const auto [name, wrapper_type, text_type] =
      GENERATE(table<std::string, std::string, std::string>(
          {{"qwen3_5_text_tiny_b", "qwen3_5", "qwen3_5_text"},
           {"qwen3_5_moe_tiny", "qwen3_5_moe", "qwen3_5_moe_text"}}));
  INFO(name);
  TempDir dir("wrapper");
  nlohmann::json text = read_json(fixture(name) / "config.json");
  nlohmann::json wrapper = {{"model_type", wrapper_type},
                            {"architectures", {"Qwen3_5ForConditionalGeneration"}},
                            {"text_config", text},
                            {"vision_config", {{"depth", 1}, {"hidden_size", 32}}},
                            {"tie_word_embeddings", text["tie_word_embeddings"]}};
  write_json(dir.path() / "config.json", wrapper);
  // Qwen3_5ForConditionalGeneration.save_pretrained: text under model.language_model., the
  // vision tower under model.visual. (ignored), lm_head at the top.
  rewrite_weights(name, dir.path(),
                  [](const std::string& n) {
                    return n.rfind("model.", 0) == 0 ? "model.language_model." + n.substr(6) : n;
                  },
                  {{"model.visual.patch_embed.proj.weight", at::ones({4, 4})},
                   {"mtp.fc.weight", at::ones({2, 2})}});
  const at::Tensor ids = reference(name, "input_ids");
  const auto spec = arch::load_model_spec(dir.path());
  CHECK(spec.model_type == text_type);
  CHECK(spec.config_model_type == wrapper_type);
  CHECK(max_abs_error(run_fixture(dir.path(), ids), run_fixture(fixture(name), ids)) == 0.0);
}

TEST_CASE("qwen3_next accepts fused (transformers v5) expert tensors", "[arch]") {
  const std::string name = "qwen3_next_tiny";
  TempDir dir("fused");
  fs::copy_file(fixture(name) / "config.json", dir.path() / "config.json");
  auto ckpt = io::Checkpoint::open(fixture(name));
  std::vector<std::pair<std::string, at::Tensor>> fused;
  for (int64_t layer : {0, 1, 3}) {  // the MoE layers (2 is in mlp_only_layers)
    std::vector<at::Tensor> gate_up, down;
    for (int64_t e = 0; e < 4; ++e) {
      const auto p = fmt::format("model.layers.{}.mlp.experts.{}.", layer, e);
      gate_up.push_back(at::cat({arch::checkpoint_tensor(ckpt, p + "gate_proj.weight"),
                                 arch::checkpoint_tensor(ckpt, p + "up_proj.weight")}));
      down.push_back(arch::checkpoint_tensor(ckpt, p + "down_proj.weight"));
    }
    fused.emplace_back(fmt::format("model.layers.{}.mlp.experts.gate_up_proj", layer),
                       at::stack(gate_up));
    fused.emplace_back(fmt::format("model.layers.{}.mlp.experts.down_proj", layer),
                       at::stack(down));
  }
  rewrite_weights(
      name, dir.path(),
      [](const std::string& n) { return n.find(".mlp.experts.") != std::string::npos ? "" : n; },
      fused);
  const at::Tensor ids = reference(name, "input_ids");
  const at::Tensor ref = reference(name, "logits_fp32");
  CHECK(max_abs_error(run_fixture(dir.path(), ids), ref) <= 1e-4 * logit_scale(ref));
}

TEST_CASE("qwen hybrid load names a missing or mis-shaped tensor", "[arch]") {
  const std::string name = "qwen3_next_tiny";
  TempDir dir("missing");
  fs::copy_file(fixture(name) / "config.json", dir.path() / "config.json");
  SECTION("missing") {
    const std::string dropped = "model.layers.0.linear_attn.in_proj_qkvz.weight";
    rewrite_weights(name, dir.path(),
                    [&](const std::string& n) { return n == dropped ? std::string() : n; });
    REQUIRE_THROWS_AS(arch::load_model(dir.path(), {}), InputError);
    REQUIRE_THROWS_WITH(arch::load_model(dir.path(), {}), Catch::Contains(dropped));
  }
  SECTION("missing expert") {
    const std::string dropped = "model.layers.3.mlp.experts.2.up_proj.weight";
    rewrite_weights(name, dir.path(),
                    [&](const std::string& n) { return n == dropped ? std::string() : n; });
    REQUIRE_THROWS_WITH(arch::load_model(dir.path(), {}), Catch::Contains(dropped));
  }
  SECTION("wrong shape") {
    const std::string bad = "model.layers.1.self_attn.q_norm.weight";
    rewrite_weights(name, dir.path(),
                    [&](const std::string& n) { return n == bad ? std::string() : n; },
                    {{bad, at::zeros({8})}});
    REQUIRE_THROWS_WITH(arch::load_model(dir.path(), {}),
                        Catch::Contains(bad) && Catch::Contains("[16]"));
  }
}
