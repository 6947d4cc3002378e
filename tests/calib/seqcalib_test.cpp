#include <catch2/catch.hpp>

#include "headwise/calib/seqcalib.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/window.hpp"
#include "toy_model.hpp"

using namespace headwise;
using test::HeadRole;

namespace {

constexpr int64_t kContext = 64;

// Unpaged fp32 bytes of one KV head: min(w, C) * head_dim * 2 * 4.
int64_t toy_head_bytes(int64_t window) { return std::min(window, kContext) * test::kToyHeadDim * 2 * 4; }

calib::SeqCalibOptions toy_options(const char* ladder, int64_t budget) {
  calib::SeqCalibOptions o;
  o.ladder = measure::parse_window_ladder(ladder, "test");
  o.global_budget_bytes = budget;
  o.head_bytes = [](const arch::LayerSpec&, int64_t window) { return toy_head_bytes(window); };
  return o;
}

at::Tensor final_hidden(test::ToyModel& model, const std::vector<std::vector<int64_t>>& seqs,
                        const std::map<int64_t, std::vector<int64_t>>* windows) {
  at::Tensor ids = at::empty({static_cast<int64_t>(seqs.size()), static_cast<int64_t>(seqs[0].size())}, at::kLong);
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (size_t t = 0; t < seqs[i].size(); ++t) ids[static_cast<int64_t>(i)][static_cast<int64_t>(t)] = seqs[i][t];
  }
  at::Tensor h = model.embed(ids);
  arch::ExactAttentionCore exact;
  std::map<int64_t, std::vector<int64_t>> none;
  calib::PolicyAttentionCore policy(windows ? *windows : none, 0, 512);
  for (int64_t i = 0; i < model.spec().num_layers(); ++i) {
    arch::AttentionCore* core = windows ? static_cast<arch::AttentionCore*>(&policy) : &exact;
    h = model.run_layer(i, h, {core, nullptr, 0});
  }
  return h;
}

}  // namespace

TEST_CASE("SeqCalib gives planted far heads long windows and local heads short ones", "[calib]") {
  const std::vector<test::ToyHead> layer{{HeadRole::kLocal}, {HeadRole::kFar}, {HeadRole::kLocal}, {HeadRole::kFar}};
  test::ToyModel model({layer, layer});
  const auto seqs = test::toy_sequences(4, kContext, 3);
  // Exactly enough for every far head at full and every local head at the shortest level.
  const int64_t budget = 2 * (2 * toy_head_bytes(kFullWindow) + 2 * toy_head_bytes(4));
  const auto result = calib::run_seqcalib(model, seqs, toy_options("4,16,full", budget));
  for (int64_t id : {0, 1}) {
    CHECK(result.windows.at(id) == std::vector<int64_t>{4, kFullWindow, 4, kFullWindow});
  }
  CHECK(result.global_bytes <= budget);
  // Far heads' curves fall with the window; local heads' are (near) zero everywhere.
  for (const auto& curve : result.curves) {
    if (curve.kv_head % 2 == 1) {
      CHECK(curve.distortion[0] > 0.01);
      CHECK(curve.distortion[2] == 0.0);
    } else {
      CHECK(curve.distortion[0] < 1e-6);
    }
  }
}

TEST_CASE("SeqCalib: a budget at or above full KV gives full everywhere; below the minimum it refuses", "[calib]") {
  const std::vector<test::ToyHead> layer{{HeadRole::kLocal}, {HeadRole::kFar}};
  test::ToyModel model({layer});
  const auto seqs = test::toy_sequences(2, kContext, 5);
  const auto full = calib::run_seqcalib(model, seqs, toy_options("4,16,full", 2 * toy_head_bytes(kFullWindow)));
  CHECK(full.windows.at(0) == std::vector<int64_t>{kFullWindow, kFullWindow});
  CHECK_THROWS_AS(calib::run_seqcalib(model, seqs, toy_options("4,16,full", 2 * toy_head_bytes(4) - 1)), InfeasibleError);
}

TEST_CASE("conditioning changes the decision and lowers the end-to-end error", "[calib]") {
  // Layer 0: a strong local head and a far head X that retrieves position 0 into the
  // residual. Layer 1: a backup head A that retrieves position 0 only when nothing below did,
  // and a uniform head Z. The budget pays for one full window among the four heads.
  test::ToyModel model({{{HeadRole::kLocal, 3.0}, {HeadRole::kFar, 1.0}},
                        {{HeadRole::kBackup, 1.0}, {HeadRole::kUniform, 0.6}}});
  const auto seqs = test::toy_sequences(4, kContext, 9);
  const int64_t budget = 3 * toy_head_bytes(4) + toy_head_bytes(kFullWindow);

  auto unconditioned_options = toy_options("4,full", budget);
  unconditioned_options.conditioned = false;
  const auto unconditioned = calib::run_seqcalib(model, seqs, unconditioned_options);
  const auto seqcalib = calib::run_seqcalib(model, seqs, toy_options("4,full", budget));

  // With full KV below, A looks local and Z looks costly to truncate: Z gets the full window.
  CHECK(unconditioned.windows.at(1) == std::vector<int64_t>{4, kFullWindow});
  // On the deployed stream X is truncated, A must retrieve: SeqCalib gives A the full window.
  CHECK(seqcalib.windows.at(0) == std::vector<int64_t>{4, 4});
  CHECK(seqcalib.windows.at(1) == std::vector<int64_t>{kFullWindow, 4});

  const at::Tensor reference = final_hidden(model, seqs, nullptr);
  const double error_unconditioned = (final_hidden(model, seqs, &unconditioned.windows) - reference).pow(2).mean().item<double>();
  const double error_seqcalib = (final_hidden(model, seqs, &seqcalib.windows) - reference).pow(2).mean().item<double>();
  INFO("unconditioned " << error_unconditioned << " seqcalib " << error_seqcalib);
  CHECK(error_seqcalib < 0.5 * error_unconditioned);
}

TEST_CASE("SeqCalib is deterministic and independent of the micro-batch split", "[calib]") {
  const std::vector<test::ToyHead> layer{{HeadRole::kUniform}, {HeadRole::kFar}, {HeadRole::kLocal}};
  test::ToyModel model({layer, layer});
  const auto seqs = test::toy_sequences(4, kContext, 21);
  const int64_t budget = 2 * (toy_head_bytes(kFullWindow) + toy_head_bytes(16) + toy_head_bytes(4));
  auto options = toy_options("4,16,full", budget);
  const auto a = calib::run_seqcalib(model, seqs, options);
  const auto b = calib::run_seqcalib(model, seqs, options);
  options.micro_batch = 3;
  const auto split = calib::run_seqcalib(model, seqs, options);
  CHECK(a.windows == b.windows);
  CHECK(a.windows == split.windows);
  REQUIRE(a.curves.size() == split.curves.size());
  for (size_t i = 0; i < a.curves.size(); ++i) {
    CHECK(a.curves[i].distortion == b.curves[i].distortion);
    for (size_t l = 0; l < a.curves[i].distortion.size(); ++l) {
      CHECK(split.curves[i].distortion[l] == Approx(a.curves[i].distortion[l]).epsilon(1e-6).margin(1e-12));
    }
  }
}
