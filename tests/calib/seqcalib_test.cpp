#include <catch2/catch.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "headwise/calib/calibration_data.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/window.hpp"
#include "toy_model.hpp"

#include <algorithm>

using namespace headwise;
using test::HeadRole;

namespace {

constexpr int64_t kContext = 64;

// Unpaged fp32 bytes of one KV head: min(w, C) * head_dim * 2 * 4.
int64_t toy_head_bytes(int64_t window) {
  return std::min(window, kContext) * test::kToyHeadDim * 2 * 4;
}

calib::SeqCalibOptions toy_options(const char* ladder, int64_t budget) {
  calib::SeqCalibOptions o;
  o.ladder = measure::parse_window_ladder(ladder, "test");
  o.global_budget_bytes = budget;
  o.head_bytes = [](const arch::LayerSpec&, int64_t window) { return toy_head_bytes(window); };
  return o;
}

at::Tensor final_hidden(test::ToyModel& model, const std::vector<std::vector<int64_t>>& seqs,
                        const std::map<int64_t, std::vector<int64_t>>* windows) {
  at::Tensor ids = at::empty(
      {static_cast<int64_t>(seqs.size()), static_cast<int64_t>(seqs[0].size())}, at::kLong);
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (size_t t = 0; t < seqs[i].size(); ++t)
      ids[static_cast<int64_t>(i)][static_cast<int64_t>(t)] = seqs[i][t];
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

// Runs `options` twice and once more in micro-batches of 3: the windows and curves must be the
// same bytes run to run, and the split may only move curves within `epsilon`/`margin`.
void check_deterministic_and_split_independent(test::ToyModel& model,
                                               const std::vector<std::vector<int64_t>>& seqs,
                                               calib::SeqCalibOptions options, double epsilon,
                                               double margin) {
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
      CHECK(split.curves[i].distortion[l] ==
            Approx(a.curves[i].distortion[l]).epsilon(epsilon).margin(margin));
    }
  }
}

}  // namespace

TEST_CASE("SeqCalib gives planted far heads long windows and local heads short ones", "[calib]") {
  const std::vector<test::ToyHead> layer{
      {HeadRole::kLocal}, {HeadRole::kFar}, {HeadRole::kLocal}, {HeadRole::kFar}};
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

TEST_CASE(
    "SeqCalib: a budget at or above full KV gives full everywhere; below the minimum it refuses",
    "[calib]") {
  const std::vector<test::ToyHead> layer{{HeadRole::kLocal}, {HeadRole::kFar}};
  test::ToyModel model({layer});
  const auto seqs = test::toy_sequences(2, kContext, 5);
  const auto full =
      calib::run_seqcalib(model, seqs, toy_options("4,16,full", 2 * toy_head_bytes(kFullWindow)));
  CHECK(full.windows.at(0) == std::vector<int64_t>{kFullWindow, kFullWindow});
  CHECK_THROWS_AS(
      calib::run_seqcalib(model, seqs, toy_options("4,16,full", 2 * toy_head_bytes(4) - 1)),
      InfeasibleError);
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
  const double error_unconditioned =
      (final_hidden(model, seqs, &unconditioned.windows) - reference).pow(2).mean().item<double>();
  const double error_seqcalib =
      (final_hidden(model, seqs, &seqcalib.windows) - reference).pow(2).mean().item<double>();
  INFO("unconditioned " << error_unconditioned << " seqcalib " << error_seqcalib);
  CHECK(error_seqcalib < 0.5 * error_unconditioned);
}

TEST_CASE("SeqCalib is deterministic and independent of the micro-batch split", "[calib]") {
  const std::vector<test::ToyHead> layer{
      {HeadRole::kUniform}, {HeadRole::kFar}, {HeadRole::kLocal}};
  test::ToyModel model({layer, layer});
  const auto seqs = test::toy_sequences(4, kContext, 21);
  const int64_t budget = 2 * (toy_head_bytes(kFullWindow) + toy_head_bytes(16) + toy_head_bytes(4));
  check_deterministic_and_split_independent(model, seqs, toy_options("4,16,full", budget), 1e-6,
                                            1e-12);
}

namespace {

calib::SeqCalibOptions answer_options(const char* ladder, int64_t budget,
                                      const std::vector<std::vector<int64_t>>& seqs) {
  auto o = toy_options(ladder, budget);
  o.measure = calib::DistortionMeasure::kAnswerKl;
  o.answer_positions = calib::tail_answer_positions(seqs, 8);
  return o;
}

// The planted toys the answer measures are tested on: a model, its sequences, a budget.
struct PlantedToy {
  test::ToyModel model;
  std::vector<std::vector<int64_t>> seqs;
  int64_t budget = 0;
};

// Head 0 retrieves position 0 but writes it with a small weight; the readout amplifies it, so
// the answer hinges on it. Heads 1-3 average content with full weight: a large block output,
// a moderate effect on the answer. The budget pays for one full window.
PlantedToy quiet_retriever() {
  return {test::ToyModel({{{HeadRole::kFar, 0.05},
                           {HeadRole::kUniform},
                           {HeadRole::kUniform},
                           {HeadRole::kUniform}}},
                         test::ToyReadout{200.0}),
          test::toy_sequences(4, kContext, 31),
          toy_head_bytes(kFullWindow) + 3 * toy_head_bytes(4)};
}

// Heads 0 and 1 each retrieve position 0 into the same slot; the readout caps the slot at what
// one of them writes, so either alone answers and cutting one alone costs nothing. Cutting both
// loses the answer. Heads 2 and 3 average content. The budget pays for two full windows.
PlantedToy backup_retrievers(test::ToyReadout readout) {
  const std::vector<test::ToyHead> layer{
      {HeadRole::kFar, 0.5}, {HeadRole::kFar, 0.5}, {HeadRole::kUniform}, {HeadRole::kUniform}};
  return {test::ToyModel({layer}, readout), test::toy_sequences(4, kContext, 41),
          2 * toy_head_bytes(kFullWindow) + 2 * toy_head_bytes(4)};
}

// Two layers of the three roles: the model the determinism checks run on.
PlantedToy two_mixed_layers() {
  const std::vector<test::ToyHead> layer{
      {HeadRole::kUniform}, {HeadRole::kFar}, {HeadRole::kLocal}};
  return {test::ToyModel({layer, layer}, test::ToyReadout{20.0}),
          test::toy_sequences(4, kContext, 23),
          2 * (toy_head_bytes(kFullWindow) + toy_head_bytes(16) + toy_head_bytes(4))};
}

}  // namespace

TEST_CASE("answer-kl keeps the retrieval head whose block output is small; block-mse cuts it",
          "[calib]") {
  auto [model, seqs, budget] = quiet_retriever();
  const auto block = calib::run_seqcalib(model, seqs, toy_options("4,16,full", budget));
  const auto answer = calib::run_seqcalib(model, seqs, answer_options("4,16,full", budget, seqs));
  INFO("block-mse " << fmt::format("{}", fmt::join(block.windows.at(0), ",")) << " answer-kl "
                    << fmt::format("{}", fmt::join(answer.windows.at(0), ",")));
  CHECK(block.windows.at(0).front() != kFullWindow);
  CHECK(answer.windows.at(0).front() == kFullWindow);
  CHECK(answer.global_bytes <= budget);
  // The policy's end-to-end answer KL is measured and reported.
  CHECK(answer.divergence_policy >= 0.0);
  CHECK(answer.answer_evaluations > 0);
  // answer-tv (the default) sees the same.
  auto tv_options = answer_options("4,16,full", budget, seqs);
  tv_options.measure = calib::DistortionMeasure::kAnswerTv;
  CHECK(calib::run_seqcalib(model, seqs, tv_options).windows.at(0).front() == kFullWindow);

  // The gradient prediction sees the same: it keeps the retrieval head, and its ranking of the
  // (head, level) pairs agrees with the exact measure's.
  auto gradient_options = answer_options("4,16,full", budget, seqs);
  gradient_options.measure = calib::DistortionMeasure::kAnswerGrad;
  gradient_options.validate_measure = true;
  const auto gradient = calib::run_seqcalib(model, seqs, gradient_options);
  INFO("answer-grad " << fmt::format("{}", fmt::join(gradient.windows.at(0), ",")));
  CHECK(gradient.windows.at(0).front() == kFullWindow);
  REQUIRE(gradient.validation.has_value());
  CHECK(gradient.validation->pairs.size() == 4 * 2);  // 4 heads x the 2 finite levels
  CHECK(gradient.validation->joint_decisions.size() == 1);
  INFO("Spearman " << gradient.validation->spearman);
  CHECK(gradient.validation->spearman >= 0.8);
}

TEST_CASE("answer-tv orders a lost answer as greedy accuracy does; answer-kl does not", "[calib]") {
  // Two answer positions whose full-model answer is token 0. "soft": both answers made unsure
  // (0.3 on the answer, 0.7 on a wrong token: both greedy answers wrong). "lost": one answer
  // exact, the other lost outright (1e-6 left on it: one greedy answer right).
  const auto log_probs = [](std::vector<std::vector<double>> rows) {
    std::vector<at::Tensor> t;
    for (const auto& r : rows) t.push_back(at::tensor(r, at::kDouble));
    return at::log(at::stack(t)).to(at::kFloat);
  };
  const at::Tensor full = log_probs({{1 - 3e-6, 1e-6, 1e-6, 1e-6}, {1 - 3e-6, 1e-6, 1e-6, 1e-6}});
  const at::Tensor soft = log_probs({{0.3, 0.7 - 2e-6, 1e-6, 1e-6}, {0.3, 0.7 - 2e-6, 1e-6, 1e-6}});
  const at::Tensor lost = full.clone();
  lost[1] = log_probs({{1e-6, 1 - 3e-6, 1e-6, 1e-6}})[0];
  const auto total = [&](const at::Tensor& q, calib::AnswerDivergence d) {
    return calib::divergence_per_position(full, q, d).sum().item<double>();
  };
  using calib::AnswerDivergence;
  INFO("KL soft " << total(soft, AnswerDivergence::kKl) << " lost "
                  << total(lost, AnswerDivergence::kKl) << "; TV soft "
                  << total(soft, AnswerDivergence::kTv) << " lost "
                  << total(lost, AnswerDivergence::kTv));
  CHECK(total(soft, AnswerDivergence::kKl) <
        total(lost, AnswerDivergence::kKl));  // KL: the lost needle dominates
  CHECK(total(lost, AnswerDivergence::kTv) <
        total(soft, AnswerDivergence::kTv));  // TV: one exact answer pays
  // TV is at most 1 per position and 0 against itself; KL of the lost answer is ~ln(1e6).
  const at::Tensor tv = calib::divergence_per_position(full, lost, AnswerDivergence::kTv);
  CHECK(tv[0].item<double>() == Approx(0.0).margin(1e-6));
  CHECK(tv[1].item<double>() == Approx(1.0 - 2e-6).epsilon(1e-4));
  CHECK(calib::divergence_per_position(full, lost, AnswerDivergence::kKl)[1].item<double>() ==
        Approx(std::log(1e6)).epsilon(1e-3));
  CHECK(calib::parse_distortion_measure("answer-tv") == calib::DistortionMeasure::kAnswerTv);
  CHECK(std::string(calib::distortion_measure_name(calib::DistortionMeasure::kAnswerTv)) ==
        "answer-tv");
}

TEST_CASE("answer-tv reports the policy's total variation at the answer positions, end to end",
          "[calib]") {
  const std::vector<test::ToyHead> layer{
      {HeadRole::kFar, 0.5}, {HeadRole::kUniform}, {HeadRole::kLocal}};
  test::ToyModel model({layer, layer}, test::ToyReadout{20.0});
  const auto seqs = test::toy_sequences(4, kContext, 51);
  // One full window for the two layers' far heads: one of them loses position 0.
  const int64_t budget = toy_head_bytes(kFullWindow) + toy_head_bytes(16) + 4 * toy_head_bytes(4);
  auto options = answer_options("4,16,full", budget, seqs);
  options.measure = calib::DistortionMeasure::kAnswerTv;
  const auto r = calib::run_seqcalib(model, seqs, options);
  // By hand: the full model's and the policy's next-token distributions at the last 8 positions.
  const auto answer_log_probs = [&](const std::map<int64_t, std::vector<int64_t>>* windows) {
    const at::Tensor h = final_hidden(model, seqs, windows);
    const int64_t t = h.size(1);
    return at::log_softmax(model.logits(h.slice(1, t - 9, t - 1)).to(at::kFloat), -1).flatten(0, 1);
  };
  const at::Tensor by_hand = calib::divergence_per_position(
      answer_log_probs(nullptr), answer_log_probs(&r.windows), calib::AnswerDivergence::kTv);
  INFO(fmt::format("windows {} / {}", fmt::join(r.windows.at(0), ","),
                   fmt::join(r.windows.at(1), ",")));
  CHECK(r.global_bytes <= budget);
  CHECK(r.divergence_policy == Approx(by_hand.mean().item<double>()).epsilon(1e-5).margin(1e-9));
  CHECK(r.divergence_policy >= 0.0);
  CHECK(r.divergence_policy <= 1.0);
  // The budget cuts a retrieval, and it shows.
  CHECK(r.divergence_policy > 1e-3);
}

TEST_CASE("answer-grad predicts a joint cut that flips the answer from heads that each look cheap",
          "[calib]") {
  // The two retrievers back each other up (the readout caps the slot at what one writes, and the
  // retrieved slot is the answer): at full KV either one's gradient is zero, so the first
  // linearisation cuts both; re-linearised there, restoring one is predicted to bring the answer
  // back, and the decision keeps one.
  auto [model, seqs, budget] = backup_retrievers(test::ToyReadout{40.0, 0.5});
  auto options = answer_options("4,full", budget, seqs);
  options.measure = calib::DistortionMeasure::kAnswerGrad;
  const auto gradient = calib::run_seqcalib(model, seqs, options);
  const auto& w = gradient.windows.at(0);
  INFO("answer-grad " << fmt::format("{}", fmt::join(w, ",")));
  CHECK((w[0] == kFullWindow) + (w[1] == kFullWindow) >= 1);
  CHECK(gradient.global_bytes <= budget);
}

TEST_CASE(
    "answer-kl decides a layer's heads jointly: of two heads that back each other up, one stays",
    "[calib]") {
  auto [model, seqs, budget] = backup_retrievers(test::ToyReadout{4.0, 0.5});
  auto independent_options = answer_options("4,full", budget, seqs);
  independent_options.joint_heads = false;
  const auto independent = calib::run_seqcalib(model, seqs, independent_options);
  const auto joint = calib::run_seqcalib(model, seqs, answer_options("4,full", budget, seqs));
  auto retrievers_kept = [](const std::vector<int64_t>& w) {
    return (w[0] == kFullWindow) + (w[1] == kFullWindow);
  };
  INFO("independent " << fmt::format("{}", fmt::join(independent.windows.at(0), ",")) << " joint "
                      << fmt::format("{}", fmt::join(joint.windows.at(0), ",")));
  // Measured with the other heads at full, each retriever looks free: both are cut.
  CHECK(retrievers_kept(independent.windows.at(0)) == 0);
  // Jointly, exactly one retriever keeps its window and the other byte goes to content.
  CHECK(retrievers_kept(joint.windows.at(0)) == 1);
  INFO("answer KL: independent " << independent.divergence_policy << " joint "
                                 << joint.divergence_policy);
  CHECK(joint.divergence_policy < 0.5 * independent.divergence_policy);
}

TEST_CASE("answer-kl is deterministic and independent of the micro-batch split", "[calib]") {
  auto [model, seqs, budget] = two_mixed_layers();
  check_deterministic_and_split_independent(model, seqs, answer_options("4,16,full", budget, seqs),
                                            1e-5, 1e-9);
}

TEST_CASE("answer-kl refuses sequences without answer positions", "[calib]") {
  test::ToyModel model({{{HeadRole::kFar}}});
  const auto seqs = test::toy_sequences(2, kContext, 3);
  auto options = answer_options("4,full", 2 * toy_head_bytes(kFullWindow), seqs);
  options.answer_positions.assign(seqs.size(), {});
  CHECK_THROWS_AS(calib::run_seqcalib(model, seqs, options), InputError);
  options.answer_positions.pop_back();
  CHECK_THROWS_AS(calib::run_seqcalib(model, seqs, options), InputError);
}

TEST_CASE(
    "fresh conditioning: a completion that moves a lower layer triggers a re-walk, kept only if it "
    "helps",
    "[calib]") {
  // Layer 0's far head is cut by the walk and lengthened by the completion, so layer 1 was
  // decided on a stream that no longer exists: the layers above it are re-walked on the completed
  // stream. On this model the re-walk reaches the same windows, so it is measured and discarded
  // (the cross-layer re-solve that follows then moves layer 0's bytes and is kept).
  test::ToyModel model({{{HeadRole::kLocal, 3.0}, {HeadRole::kFar, 1.0}},
                        {{HeadRole::kBackup, 1.0}, {HeadRole::kUniform, 0.6}}},
                       test::ToyReadout{20.0});
  const auto seqs = test::toy_sequences(4, kContext, 9);
  const int64_t budget = toy_head_bytes(kFullWindow) + 3 * toy_head_bytes(4);
  const auto r = calib::run_seqcalib(model, seqs, answer_options("4,16,full", budget, seqs));
  INFO(fmt::format("rewalks {} by pass {}", r.rewalks, fmt::join(r.divergence_by_pass, ",")));
  REQUIRE(r.divergence_by_pass.size() >= 2);  // the first policy and at least one re-walk tried
  CHECK(r.divergence_by_pass.size() <= 3);    // bounded: two re-walks at most
  // Every kept pass lowered the KL; the reported policy is the last kept one.
  for (int64_t p = 1; p <= r.rewalks; ++p)
    CHECK(r.divergence_by_pass[p] < r.divergence_by_pass[p - 1]);
  // The cross-layer re-solve starts from the last kept re-walk.
  REQUIRE(!r.divergence_by_resolve.empty());
  CHECK(r.divergence_by_resolve.front() == r.divergence_by_pass[static_cast<size_t>(r.rewalks)]);
  CHECK(r.divergence_policy == r.divergence_by_resolve[static_cast<size_t>(r.resolves)]);
  CHECK(r.global_bytes <= budget);
}

TEST_CASE("cross-layer re-solve: bytes a lower layer kept go to the layer above that needs them",
          "[calib]") {
  // Layer 0 averages content; layer 1's two retrievers back each other up (the readout caps the
  // slot at what one writes), so measured with the other at full each looks free to cut. Priced
  // by those curves, the walk leaves layer 0 at full and layer 1 can then afford neither
  // retriever. Their conditioned curves (around that decision) show a retriever is worth far more
  // than layer 0's window: the exact re-solve moves layer 0's bytes up, the re-walk keeps one
  // retriever, and the end-to-end answer KL drops.
  test::ToyModel model({{{HeadRole::kUniform}}, {{HeadRole::kFar, 0.5}, {HeadRole::kFar, 0.5}}},
                       test::ToyReadout{20.0, 0.5});
  const auto seqs = test::toy_sequences(4, kContext, 41);
  const int64_t budget = toy_head_bytes(kFullWindow) + 3 * toy_head_bytes(4);
  const auto r = calib::run_seqcalib(model, seqs, answer_options("4,full", budget, seqs));
  INFO(fmt::format("windows {} / {}, resolves {}, KL by resolve {}",
                   fmt::join(r.windows.at(0), ","), fmt::join(r.windows.at(1), ","), r.resolves,
                   fmt::join(r.divergence_by_resolve, ",")));
  CHECK(r.resolves >= 1);
  CHECK(r.windows.at(0) == std::vector<int64_t>{4});
  const auto& top = r.windows.at(1);
  CHECK((top[0] == kFullWindow) + (top[1] == kFullWindow) == 1);
  CHECK(r.divergence_policy < 0.5 * r.divergence_by_resolve.front());
  CHECK(r.global_bytes <= budget);
  // The ablation keeps the walk's allocation: the re-solve is what moved the bytes.
  auto without_conditioning = answer_options("4,full", budget, seqs);
  without_conditioning.conditioned = false;
  CHECK(calib::run_seqcalib(model, seqs, without_conditioning).resolves == 0);
}

namespace {

calib::SeqCalibOptions span_options(const char* ladder, int64_t budget,
                                    const std::vector<std::vector<int64_t>>& seqs) {
  auto o = answer_options(ladder, budget, seqs);
  o.measure = calib::DistortionMeasure::kAnswerTvSpan;
  return o;
}

}  // namespace

TEST_CASE(
    "answer-tv-span decides the planted toys as the exact answer-tv does, validated against it",
    "[calib]") {
  // The retrieval head that writes little and the two backup retrievers: the cases answer-kl is
  // built for. The span measure runs each candidate on the answer span only; here it must keep
  // the retrieval head and exactly one of the two backups, as the exact measure does.
  {
    auto [model, seqs, budget] = quiet_retriever();
    auto exact_options = answer_options("4,16,full", budget, seqs);
    exact_options.measure = calib::DistortionMeasure::kAnswerTv;
    const auto exact = calib::run_seqcalib(model, seqs, exact_options);
    auto options = span_options("4,16,full", budget, seqs);
    options.validate_measure = true;
    const auto span = calib::run_seqcalib(model, seqs, options);
    INFO("exact " << fmt::format("{}", fmt::join(exact.windows.at(0), ",")) << " span "
                  << fmt::format("{}", fmt::join(span.windows.at(0), ",")));
    CHECK(span.windows == exact.windows);
    CHECK(span.windows.at(0).front() == kFullWindow);
    REQUIRE(span.validation.has_value());
    CHECK(span.validation->pairs.size() == 4 * 2);
    INFO("Spearman " << span.validation->spearman);
    CHECK(span.validation->spearman >= 0.9);
    REQUIRE(span.validation->joint_decisions.size() == 1);
    const auto& decision = span.validation->joint_decisions.front();
    CHECK(decision.exact_windows ==
          decision.windows);  // the exact measure's own decision is the same
    CHECK(decision.measured <= 1.1 * decision.exact_measured + 1e-9);
  }
  {
    auto [model, seqs, budget] = backup_retrievers(test::ToyReadout{4.0, 0.5});
    const auto span = calib::run_seqcalib(model, seqs, span_options("4,full", budget, seqs));
    const auto& w = span.windows.at(0);
    INFO("span " << fmt::format("{}", fmt::join(w, ",")));
    CHECK((w[0] == kFullWindow) + (w[1] == kFullWindow) == 1);
    CHECK(span.global_bytes <= budget);
    // The walk's end-to-end divergence is read off its own final stream: measured, and small.
    CHECK(span.divergence_walk >= 0.0);
    CHECK(span.divergence_walk < 0.1);
  }
}

TEST_CASE(
    "answer-tv-span: the cross-layer re-solve checked on the answer span moves the bytes up as the "
    "re-walk does",
    "[calib]") {
  // The planted toy of the re-solve (see above) under the span measure: the default checks the
  // exact solve's proposal against the walk's policy on the span (no re-walk, nothing re-decided);
  // --re-solve-by-rewalk re-walks the layer above. Both must move layer 0's bytes to one retriever.
  test::ToyModel model({{{HeadRole::kUniform}}, {{HeadRole::kFar, 0.5}, {HeadRole::kFar, 0.5}}},
                       test::ToyReadout{20.0, 0.5});
  const auto seqs = test::toy_sequences(4, kContext, 41);
  const int64_t budget = toy_head_bytes(kFullWindow) + 3 * toy_head_bytes(4);
  for (const bool rewalk : {false, true}) {
    INFO("re-walk " << rewalk);
    auto options = span_options("4,full", budget, seqs);
    options.resolve_by_rewalk = rewalk;
    const auto r = calib::run_seqcalib(model, seqs, options);
    INFO(fmt::format("windows {} / {}, resolves {}, span by resolve {}, by re-walk {}",
                     fmt::join(r.windows.at(0), ","), fmt::join(r.windows.at(1), ","), r.resolves,
                     fmt::join(r.span_by_resolve, ","), fmt::join(r.divergence_by_resolve, ",")));
    CHECK(r.resolves == 1);
    // The kept policy is complete: one expected value per head, as for a walk's.
    for (const auto& [layer, windows] : r.windows)
      CHECK(r.expected_distortion.at(layer).size() == windows.size());
    CHECK(r.windows.at(0) == std::vector<int64_t>{4});
    const auto& top = r.windows.at(1);
    CHECK((top[0] == kFullWindow) + (top[1] == kFullWindow) == 1);
    CHECK(r.global_bytes <= budget);
    if (rewalk) {
      CHECK(r.span_by_resolve.empty());
      REQUIRE(r.divergence_by_resolve.size() == 2);
      CHECK(r.divergence_by_resolve[1] < 0.5 * r.divergence_by_resolve[0]);
    } else {
      REQUIRE(r.span_by_resolve.size() == 2);
      CHECK(r.span_by_resolve[1] < 0.5 * r.span_by_resolve[0]);
      // The walk's own end-to-end value stays what it measured; the re-walk did not run.
      REQUIRE(r.divergence_by_resolve.size() == 1);
      CHECK(r.divergence_by_resolve[0] == r.divergence_walk);
    }
  }
}

TEST_CASE(
    "answer-tv-span decides the same when the measured layer may not stay resident (separate "
    "capture, sweep and run passes)",
    "[calib]") {
  auto [model, seqs, budget] = two_mixed_layers();
  auto options = span_options("4,16,full", budget, seqs);
  // One micro-batch: the upper layer is decided inside its own pass when it may stay resident.
  options.micro_batch = static_cast<int64_t>(seqs.size());
  const auto in_its_pass = calib::run_seqcalib(model, seqs, options);
  auto released_options = options;
  released_options.measured_layer_resident = false;
  const auto released = calib::run_seqcalib(model, seqs, released_options);
  CHECK(released.windows == in_its_pass.windows);
  CHECK(released.global_bytes == in_its_pass.global_bytes);
  REQUIRE(released.curves.size() == in_its_pass.curves.size());
  for (size_t c = 0; c < released.curves.size(); ++c) {
    const auto& a = released.curves[c].distortion;
    const auto& b = in_its_pass.curves[c].distortion;
    REQUIRE(a.size() == b.size());
    for (size_t l = 0; l < a.size(); ++l) CHECK(a[l] == Approx(b[l]).epsilon(1e-9).margin(1e-12));
  }
  CHECK(released.divergence_walk == Approx(in_its_pass.divergence_walk).epsilon(1e-9));
}

TEST_CASE(
    "answer-tv-span is deterministic, independent of the micro-batch split, and refuses a bad "
    "margin",
    "[calib]") {
  auto [model, seqs, budget] = two_mixed_layers();
  check_deterministic_and_split_independent(model, seqs, span_options("4,16,full", budget, seqs),
                                            1e-5, 1e-9);
  CHECK(calib::parse_distortion_measure("answer-tv-span") ==
        calib::DistortionMeasure::kAnswerTvSpan);
  CHECK(calib::parse_distortion_measure("answer-kl-span") ==
        calib::DistortionMeasure::kAnswerKlSpan);
  CHECK(calib::answer_divergence(calib::DistortionMeasure::kAnswerKlSpan) ==
        calib::AnswerDivergence::kKl);
}

TEST_CASE("answer-tv-span states how sure each walked layer's decision is (issue 59)", "[calib]") {
  auto [model, seqs, budget] = two_mixed_layers();
  const auto options = span_options("4,16,full", budget, seqs);
  const auto r = calib::run_seqcalib(model, seqs, options);
  REQUIRE(r.decision_noise.size() == 2);  // one per global layer, in layer order
  for (size_t i = 0; i < r.decision_noise.size(); ++i) {
    const auto& n = r.decision_noise[i];
    INFO("layer " << n.layer_id);
    CHECK(n.layer_id == static_cast<int64_t>(i));
    CHECK(n.windows.size() == 3);
    CHECK(n.sequences == static_cast<int64_t>(seqs.size()));
    CHECK(n.replicates == 2000);
    CHECK(n.value_lower <= n.value_upper);
    CHECK(n.alternatives > 0);
    REQUIRE_FALSE(n.runner_up_windows.empty());
    CHECK(n.runner_up_windows != n.windows);
    CHECK(n.gap_lower <= n.gap_upper);
    CHECK(n.separated == (n.gap_lower > 0.0));
    CHECK(n.gap_positive_share >= 0.0);
    CHECK(n.gap_positive_share <= 1.0);
  }
  // Deterministic: the same run gives the same intervals.
  const auto again = calib::run_seqcalib(model, seqs, options);
  REQUIRE(again.decision_noise.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(again.decision_noise[i].gap_lower == r.decision_noise[i].gap_lower);
    CHECK(again.decision_noise[i].value_upper == r.decision_noise[i].value_upper);
  }
  // Measures without per-sequence values say nothing.
  CHECK(calib::run_seqcalib(model, seqs, answer_options("4,16,full", budget, seqs))
            .decision_noise.empty());
}
