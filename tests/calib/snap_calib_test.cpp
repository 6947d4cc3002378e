// The snap rule in calibration (--keep-rules window,h2o,snap; docs/keep-rules.md): measured after
// the prompt end only, chosen per head jointly with the levels, and priced to the byte with its
// layer's bookkeeping.
#include <c10/core/InferenceMode.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "../arch/fixture_reference.hpp"
#include "headwise/arch/ops.hpp"
#include "headwise/calib/answer_span.hpp"
#include "headwise/calib/calibration_job.hpp"
#include "headwise/calib/calibration_options.hpp"
#include "headwise/calib/keep_rules.hpp"
#include "headwise/calib/prompt_end.hpp"
#include "headwise/core/error.hpp"
#include "headwise/policy/policy.hpp"
#include "toy_model.hpp"

using namespace headwise;

namespace {

// A snap head keeps its last 32 prompt tokens (the observation window) and selects with the rest
// of its slots, so the ladder has a level above 32 and the needle lies before the window.
constexpr int64_t kSteps = 160;
constexpr int64_t kNeedle = 80;        // outside every window below the whole sequence
constexpr int64_t kQuestion = 144;     // the question's tokens: kQuestion..kSteps-1
constexpr int64_t kFirstAnswer = 150;  // the prompt ends here; the answers follow
constexpr int64_t kNeedleToken = 1;
constexpr int64_t kQuestionToken = 2;
constexpr int64_t kQuestionDim = 15;  // the question's flag in the hidden state

// One global layer of two heads. Head 0 retrieves the needle, but only from the question's
// queries: every other query attends to itself, so neither recency nor accumulated attention
// (h2o) points at the needle, and only a rule that reads the question keeps it. Head 1 is local
// (it attends to itself): any window answers it. The needle's value lands in the residual's
// retrieved slot, which the readout amplifies, so the answers hinge on it.
//
// Hidden layout (16): [0] 1, [1] needle flag, [2] retrieved, [3..6] content, [7..10] head 1's
// output, [15] question flag.
class QuestionModel final : public arch::DecoderModel {
 public:
  explicit QuestionModel(bool question_retrieves)
      : DecoderModel(test::toy_spec({std::vector<test::ToyHead>(2, {test::HeadRole::kLocal})}),
                     nullptr, arch::ModelOptions{}) {
    at::manual_seed(99);
    embedding_ = at::zeros({test::kToyVocab, test::kToyHidden});
    embedding_.select(1, 0).fill_(1.0);
    embedding_.slice(0, 3).slice(1, 3, 7).copy_(at::randn({test::kToyVocab - 3, 4}));
    embedding_[kNeedleToken][1] = 1.0;
    if (question_retrieves) embedding_[kQuestionToken][kQuestionDim] = 1.0;
    inv_freq_ = at::tensor(std::vector<float>{1.0F, 0.71F, 0.453F, 0.297F, 0.1931F, 0.1237F});
  }

  at::Tensor embed(const at::Tensor& ids) override {
    return embedding_.index_select(0, ids.flatten())
        .view({ids.size(0), ids.size(1), test::kToyHidden});
  }
  at::Tensor logits(const at::Tensor& hidden) override {
    const at::Tensor h = hidden.to(at::kFloat);
    return at::cat({h.slice(-1, 0, 2), h.slice(-1, 2, 3) * 50.0, h.slice(-1, 3)}, -1);
  }
  std::vector<arch::WeightRequirement> required_weights() const override { return {}; }

  at::Tensor run_layer(int64_t layer, const at::Tensor& hidden,
                       const arch::LayerRun& run) override {
    const int64_t batch = hidden.size(0), steps = hidden.size(1), hd = test::kToyHeadDim;
    const auto rope = arch::rotary_table(inv_freq_, run.position_offset, steps, 1.0, at::kFloat);
    const auto shape = std::vector<int64_t>{batch, steps, hd};
    const at::Tensor one = hidden.select(2, 0), needle = hidden.select(2, 1);
    const at::Tensor question = hidden.select(2, kQuestionDim);
    std::vector<at::Tensor> qs, ks, vs;
    for (int64_t h = 0; h < 2; ++h) {
      at::Tensor q = at::zeros(shape), k = at::zeros(shape), v = at::zeros(shape);
      for (int64_t p = 0; p < test::kToyRotary / 2; ++p) {
        q.select(2, p).copy_(one * 6.3 / std::sqrt(6.0));
        k.select(2, p).copy_(one * 6.3 / std::sqrt(6.0));
      }
      if (h == 0) {
        q.select(2, test::kToyRotary).copy_(question * 11.0);
        k.select(2, test::kToyRotary).copy_(needle * 11.0);
        v.select(2, 0).copy_(needle);
      } else {
        v.slice(2, 0, 4).copy_(hidden.slice(2, 3, 7));
      }
      qs.push_back(q);
      ks.push_back(k);
      vs.push_back(v);
    }
    at::Tensor o_proj = at::zeros({test::kToyHidden, 2 * hd});
    o_proj[2][0] = 1.0;
    for (int64_t d = 0; d < 4; ++d) o_proj[7 + d][hd + d] = 1.0;
    arch::AttentionInputs in;
    in.layer_id = layer;
    in.q = arch::apply_rotary(at::stack(qs, 1), rope);
    in.k = arch::apply_rotary(at::stack(ks, 1), rope);
    in.v = at::stack(vs, 1);
    in.scaling = 1.0;
    in.position_offset = run.position_offset;
    in.o_proj_weight = o_proj;
    arch::ExactAttentionCore exact;
    const at::Tensor attn = (run.attention ? run.attention : &exact)->attend(in);
    return hidden + at::matmul(attn.reshape({batch, steps, 2 * hd}), o_proj.t());
  }

 private:
  at::Tensor embedding_;
  at::Tensor inv_freq_;
};

// Random content, the needle at kNeedle, the question's tokens from kQuestion on.
std::vector<std::vector<int64_t>> question_sequences(int64_t samples) {
  at::manual_seed(5);
  std::vector<std::vector<int64_t>> out;
  for (int64_t s = 0; s < samples; ++s) {
    const at::Tensor ids = at::randint(3, test::kToyVocab, {kSteps}, at::kLong);
    std::vector<int64_t> seq(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + kSteps);
    seq[kNeedle] = kNeedleToken;
    for (int64_t t = kQuestion; t < kSteps; ++t) seq[static_cast<size_t>(t)] = kQuestionToken;
    out.push_back(seq);
  }
  return out;
}

struct SnapRun {
  calib::KeepRuleResult result;
  calib::KeepRuleOptions options;
};

// The joint pass on the question model from the walk's windows {64, 64}, ladder 8, 40, 64, full,
// at the windows' bytes plus `budget_over_windows` (or at `budget`).
SnapRun run_pass(arch::DecoderModel& model, int64_t budget_over_windows,
                 std::vector<policy::KeepRule> rules, int64_t budget = 0) {
  const auto seqs = question_sequences(3);
  std::vector<int64_t> answers;
  for (int64_t t = kFirstAnswer; t < kSteps - 1; ++t) answers.push_back(t);
  const std::vector<std::vector<int64_t>> all(seqs.size(), answers);
  const std::map<int64_t, std::vector<int64_t>> windows{{0, {64, 64}}};
  calib::AnswerSpanOptions so;
  so.windows = {8, 40, 64, kFullWindow};
  so.margin = 4;
  calib::AnswerSpan span(model, seqs, all, so);
  SnapRun r;
  r.options.rules = std::move(rules);
  r.options.memory = test::toy_memory_options(kSteps);
  r.options.budget_bytes =
      budget > 0 ? budget
                 : memory::estimate(model.spec(), windows, r.options.memory).total_bytes +
                       budget_over_windows;
  r.options.prefill_chunk = 8;
  r.options.span = &span;
  r.result = calib::choose_keep_rules(model, seqs, all, windows, r.options);
  return r;
}

std::set<int64_t> selecting_layers(const calib::KeepRuleResult& r) {
  std::set<int64_t> out;
  for (const auto& [layer, rules] : r.rules) {
    for (const auto& rule : rules) {
      if (rule != policy::KeepRule::kWindow) out.insert(layer);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("snap is chosen, at fewer slots, for the head whose needle only the question finds",
          "[calib][keep-rules]") {
  c10::InferenceMode inference;
  QuestionModel model(/*question_retrieves=*/true);
  const auto r = run_pass(model, 0, {policy::KeepRule::kH2O, policy::KeepRule::kSnap});
  const auto& rules = r.result.rules.at(0);
  INFO("windows " << r.result.windows.at(0)[0] << "," << r.result.windows.at(0)[1]);
  CHECK((rules[0] == policy::KeepRule::kSnap));
  // The walk's windows fill the budget: the layer's bookkeeping is paid by a head taking a ladder
  // level below its window (the snap head or the local one: both answer with 40 slots).
  CHECK(r.result.windows.at(0)[0] + r.result.windows.at(0)[1] < 128);
  const auto& layer = r.result.layers.front();
  CHECK(layer.divergence_chosen < 0.2 * layer.divergence_windows);
  // Bytes, exact: the policy's estimate holds the bookkeeping the report states, within budget.
  const auto estimate = memory::estimate(model.spec(), r.result.windows, r.options.memory,
                                         selecting_layers(r.result));
  CHECK(layer.selection_bytes == estimate.components.selection_state_bytes);
  CHECK(layer.selection_bytes == memory::selection_bytes(*model.spec().layer(0).attention,
                                                         r.result.windows.at(0), r.options.memory));
  CHECK(estimate.total_bytes <= r.options.budget_bytes);
  // At a budget of exactly those bytes the same choice fits; one byte less and it does not.
  const auto tight = run_pass(model, 0, r.options.rules, estimate.total_bytes);
  CHECK(tight.result.windows == r.result.windows);
  CHECK((tight.result.rules == r.result.rules));
  const auto below = run_pass(model, 0, r.options.rules, estimate.total_bytes - 1);
  const auto below_bytes = memory::estimate(model.spec(), below.result.windows, r.options.memory,
                                            selecting_layers(below.result));
  CHECK(below_bytes.total_bytes <= estimate.total_bytes - 1);
  CHECK(below.result.windows != r.result.windows);
  // Deterministic.
  const auto again = run_pass(model, 0, r.options.rules);
  CHECK(again.result.windows == r.result.windows);
  CHECK((again.result.rules == r.result.rules));
  CHECK(again.result.divergence_final == r.result.divergence_final);
}

TEST_CASE("snap is not chosen where the question cannot find the needle", "[calib][keep-rules]") {
  c10::InferenceMode inference;
  // The question's queries do not look for the needle: no rule recovers it at these slots.
  QuestionModel model(/*question_retrieves=*/false);
  const auto r = run_pass(model, 0, {policy::KeepRule::kH2O, policy::KeepRule::kSnap});
  for (const auto& rule : r.result.rules.at(0)) CHECK((rule != policy::KeepRule::kSnap));
}

TEST_CASE("snap's prompt end: the last run of answers, shared by the sequences or refused",
          "[calib][keep-rules]") {
  // The built-in set's queries: the last query's answers are measured, the earlier ones are prompt.
  const std::vector<std::vector<int64_t>> queries{{10, 11, 12, 20, 21, 22},
                                                  {10, 11, 12, 20, 21, 22}};
  CHECK(calib::answers_after_prompt_end(queries) ==
        std::vector<std::vector<int64_t>>{{20, 21, 22}, {20, 21, 22}});
  CHECK(calib::shared_prompt_end(queries) == 20);
  // A tail is one run: the prompt ends at its first position.
  CHECK(calib::shared_prompt_end({{40, 41, 42, 43}}) == 40);
  CHECK_THROWS_WITH(calib::shared_prompt_end({{20, 21}, {24, 25}}),
                    Catch::Contains("prompts end at different positions (sequence 0 at 20, "
                                    "sequence 1 at 24)"));
  // Scoring an answer before the prompt end would make snap look free: refused.
  const std::vector<policy::KeepRule> snap{policy::KeepRule::kSnap};
  CHECK_THROWS_WITH(calib::rules_prompt_end(snap, queries),
                    Catch::Contains("scores answer position 10 before its prompt end 20"));
  CHECK(calib::rules_prompt_end(snap, calib::answers_after_prompt_end(queries)) == 20);
  CHECK(calib::rules_prompt_end({policy::KeepRule::kH2O}, queries) == 0);
  CHECK_THROWS_AS(calib::answers_after_prompt_end({{}}), InputError);
}

TEST_CASE(
    "--keep-rules window,h2o,snap end to end on a fixture; the exact measures are refused first",
    "[calib][keep-rules]") {
  const auto request = [](const std::string& distortion) {
    return calib::CalibrationRequest{{"model", testing::fixture_dir("qwen3_next_tiny").string()},
                                     {"context", "512"},
                                     {"budget", "24k"},
                                     {"windows", "8,32,full"},
                                     {"seq_len", "96"},
                                     {"samples", "4"},
                                     {"seed", "3"},
                                     {"keep_rules", "window,h2o,snap"},
                                     {"distortion", distortion}};
  };
  const auto out = std::filesystem::temp_directory_path() / "snap-calib.yaml";
  // Refused before the walk runs, in one line naming both flags.
  CHECK_THROWS_WITH(
      calib::CalibrationJob(calib::parse_calibration_options(request("answer-tv")), out),
      Catch::Contains("--keep-rules window,h2o,snap: snap is chosen jointly") &&
          Catch::Contains("--distortion answer-tv-span"));
  calib::CalibrationJob job(calib::parse_calibration_options(request("answer-tv-span")), out);
  const auto outcome = job.run(calib::RunControl{});
  // The policy records where it measured, and stays within the budget with its bookkeeping.
  CHECK_THAT(outcome.policy_yaml, Catch::Contains("after the prompt end"));
  CHECK_THAT(outcome.policy_yaml, Catch::Contains("keep_rules: \"window,h2o,snap\""));
  const auto policy = policy::from_yaml(outcome.policy_yaml, "snap-calib.yaml");
  CHECK(policy.memory.total_bytes <= 24 * 1024);
}
