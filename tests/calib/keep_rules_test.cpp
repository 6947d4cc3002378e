// Keep rules (--keep-rules window,h2o): the pass measures exactly what the runtime will run,
// switches a head to heavy hitters only where the answers gain, and pays the layer's
// bookkeeping from the budget; policies carry the rules and their bytes.
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <catch2/catch.hpp>

#include "../arch/fixture_reference.hpp"
#include "headwise/calib/calibration_data.hpp"
#include "headwise/calib/keep_rules.hpp"
#include "headwise/core/error.hpp"
#include "headwise/runtime/decoder.hpp"
#include "toy_keep_rule_options.hpp"
#include "toy_model.hpp"

using namespace headwise;
using test::HeadRole;

namespace {

constexpr int64_t kContext = 64;

calib::KeepRuleOptions rule_options(const arch::ModelSpec& spec,
                                    const std::map<int64_t, std::vector<int64_t>>& windows,
                                    int64_t slack) {
  return test::toy_keep_rule_options(spec, windows, kContext, slack);
}

}  // namespace

TEST_CASE(
    "keep rules give heavy hitters to a head whose needle a window loses, and windows to local "
    "heads",
    "[calib]") {
  // Head 1 retrieves position 0 from every query: a window of 4 loses it, H2O keeps it (every
  // query's attention piles onto it). The readout makes the answer hinge on it.
  test::ToyModel model(
      {{{HeadRole::kLocal}, {HeadRole::kFar, 0.05}, {HeadRole::kLocal}, {HeadRole::kLocal}}},
      test::ToyReadout{200.0});
  const auto seqs = test::toy_sequences(3, kContext, 5);
  const auto answers = calib::tail_answer_positions(seqs, 8);
  const std::map<int64_t, std::vector<int64_t>> windows{{0, {4, 4, 4, 4}}};
  for (int64_t slack : {int64_t{1} << 20, int64_t{0}}) {
    INFO("budget slack " << slack);
    const auto o = rule_options(model.spec(), windows, slack);
    const auto r = calib::choose_keep_rules(model, seqs, answers, windows, o);
    REQUIRE(r.layers.size() == 1);
    const auto& layer = r.layers.front();
    CHECK(layer.candidates == std::vector<int64_t>{0, 1, 2, 3});
    CHECK((r.rules.at(0)[1] == policy::KeepRule::kH2O));
    for (int64_t h : {0, 2, 3})
      CHECK((r.rules.at(0)[static_cast<size_t>(h)] == policy::KeepRule::kWindow));
    CHECK(layer.divergence_chosen < 0.5 * layer.divergence_windows);
    // The bookkeeping is in the bytes, and the whole policy stays within the budget: with no
    // slack the h2o head gave slots for it; window heads never change.
    const auto estimate = memory::estimate(model.spec(), r.windows, o.memory, {0});
    CHECK(layer.selection_bytes == estimate.components.selection_state_bytes);
    CHECK(estimate.total_bytes <= o.budget_bytes);
    CHECK((layer.slots_given_up > 0) == (slack == 0));
    CHECK(r.windows.at(0)[1] == 4 - layer.slots_given_up);
    for (int64_t h : {0, 2, 3}) CHECK(r.windows.at(0)[static_cast<size_t>(h)] == 4);
    // Deterministic.
    const auto again = calib::choose_keep_rules(model, seqs, answers, windows, o);
    CHECK((again.rules == r.rules));
    CHECK(again.windows == r.windows);
    CHECK(again.layers.front().divergence_chosen == layer.divergence_chosen);
  }
}

TEST_CASE("keep rules leave heads whose slots hold the whole sequence alone", "[calib]") {
  test::ToyModel model({{{HeadRole::kLocal}, {HeadRole::kFar}}});
  const auto seqs = test::toy_sequences(2, kContext, 9);
  const std::map<int64_t, std::vector<int64_t>> windows{{0, {kFullWindow, kContext}}};
  const auto r = calib::choose_keep_rules(model, seqs, calib::tail_answer_positions(seqs, 4),
                                          windows, rule_options(model.spec(), windows, 1 << 20));
  CHECK(r.layers.front().candidates.empty());
  CHECK(r.evaluations == 0);
  CHECK((r.rules.at(0) == std::vector<policy::KeepRule>(2, policy::KeepRule::kWindow)));
  CHECK(r.windows == windows);
}

TEST_CASE("simulate_eviction is the runtime decoder's prefill, layer for layer", "[calib]") {
  c10::InferenceMode inference;
  auto model =
      arch::load_model(headwise::testing::fixture_dir("qwen3_next_tiny"), arch::ModelOptions{});
  const auto& spec = model->spec();
  const int64_t layer = spec.global_layer_ids().front();
  memory::MemoryOptions o;
  o.context = 64;
  o.block_size = 4;
  o.sink_tokens = 2;
  o.kv_dtype = spec.dtype;
  // The first global layer mixes h2o (odd heads) and windows (even heads); the rest are full.
  memory::HeadWindows windows = memory::full_kv_windows(spec);
  for (size_t h = 0; h < windows[layer].size(); ++h) windows[layer][h] = h % 2 == 0 ? 5 : 12;
  runtime::EvictionOptions eviction;
  eviction.method = runtime::EvictionMethod::kH2O;
  eviction.layers = {layer};
  for (int64_t h = 0; h < static_cast<int64_t>(windows[layer].size()); h += 2)
    eviction.window_heads.insert({layer, h});
  at::Generator gen = at::detail::createCPUGenerator(17);
  const at::Tensor ids =
      at::randint(spec.vocab_size, {1, 44}, gen, at::TensorOptions().dtype(at::kLong));
  constexpr int64_t kChunk = 8;

  runtime::Decoder decoder(*model, windows, o, eviction);
  decoder.set_attention_kernel(arch::AttentionKernel::kExplicit);
  const at::Tensor runtime_logits = decoder.prefill(ids, kChunk);
  CHECK(decoder.cache_bytes() + decoder.bookkeeping_bytes() ==
        memory::estimate(spec, windows, o, {layer}).total_bytes);

  // The plain forward with only that layer simulated.
  struct OneLayer final : arch::AttentionCore {
    const arch::ModelSpec& spec;
    int64_t layer;
    const memory::HeadWindows& windows;
    const memory::MemoryOptions& options;
    const runtime::EvictionOptions& eviction;
    arch::ExactAttentionCore exact;
    OneLayer(const arch::ModelSpec& s, int64_t l, const memory::HeadWindows& w,
             const memory::MemoryOptions& o, const runtime::EvictionOptions& e)
        : spec(s), layer(l), windows(w), options(o), eviction(e) {}
    at::Tensor attend(const arch::AttentionInputs& in) override {
      if (in.layer_id != layer) return exact.attend(in);
      return runtime::simulate_eviction(spec, in, windows.at(layer), options, eviction, kChunk,
                                        512);
    }
  } core(spec, layer, windows, o, eviction);
  const at::Tensor simulated = model->logits(model->hidden_states(ids, core)).to(at::kFloat);
  const auto err = headwise::testing::compare(simulated, runtime_logits.to(at::kFloat));
  INFO("max |diff| " << err.error << " (scale " << err.scale << ")");
  CHECK(err.error <= 1e-5 * err.scale);
}

TEST_CASE("keep-rule flags and policies with rules fail with one clear line", "[calib]") {
  CHECK(calib::parse_keep_rules("window").empty());
  CHECK((calib::parse_keep_rules("h2o,window") ==
         std::vector<policy::KeepRule>{policy::KeepRule::kH2O}));
  for (const char* bad : {"h2o", "window,window", "window,h2o,h2o", "window,", "window,heavy", ""})
    CHECK_THROWS_WITH(calib::parse_keep_rules(bad), Catch::Contains("--keep-rules"));
  CHECK_THROWS_WITH(policy::keep_rule_from_name("heavy", "x.kv_head_rules[0]"),
                    Catch::Contains("x.kv_head_rules[0]"));
}

TEST_CASE("auto keep rules: heavy hitters under an answer measure, windows under block-mse",
          "[calib]") {
  using calib::DistortionMeasure;
  for (auto m : {DistortionMeasure::kAnswerTv, DistortionMeasure::kAnswerKl,
                 DistortionMeasure::kAnswerGrad}) {
    CHECK(calib::resolve_keep_rules("auto", m) == "window,h2o");
    CHECK(calib::resolve_keep_rules("h2o,window", m) ==
          "window,h2o");  // one spelling in the provenance
    CHECK(calib::resolve_keep_rules("window", m) == "window");
  }
  CHECK(calib::resolve_keep_rules("auto", DistortionMeasure::kBlockMse) == "window");
  CHECK(calib::resolve_keep_rules("window", DistortionMeasure::kBlockMse) == "window");
  CHECK_THROWS_WITH(calib::resolve_keep_rules("window,h2o", DistortionMeasure::kBlockMse),
                    Catch::Contains("--keep-rules"));
  CHECK_THROWS_WITH(calib::resolve_keep_rules("automatic", DistortionMeasure::kAnswerTv),
                    Catch::Contains("--keep-rules"));
}
