// eval's `unconditioned` ablation when no --unconditioned-policy is given: calibrated inside eval
// on its calibration samples with the policy's own measure (the default answer-tv-span included),
// its ladder and its bytes; only the conditioning is removed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "../arch/fixture_reference.hpp"
#include "eval_helpers.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/calib/measure_traits.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/eval/baselines.hpp"
#include "headwise/eval/eval.hpp"
#include "headwise/eval/tasks.hpp"

using namespace headwise;
using headwise::testing::fixture_policy;

namespace {

// The calibration eval runs for the ablation, written out here: each sample's prompt + answer
// cut from the front to the shortest, the positions that predict its generated answer tokens,
// the policy's ladder, sinks and global-KV bytes, and no conditioning.
calib::SeqCalibResult unconditioned_here(arch::DecoderModel& model, const policy::Policy& policy,
                                         const memory::MemoryOptions& options,
                                         const std::vector<eval::EvalSample>& samples,
                                         calib::DistortionMeasure measure) {
  size_t len = std::numeric_limits<size_t>::max();
  for (const auto& s : samples) len = std::min(len, s.prompt.size() + s.answer.size());
  std::vector<std::vector<int64_t>> sequences;
  calib::SeqCalibOptions o;
  for (const auto& s : samples) {
    std::vector<int64_t> tokens = s.prompt;
    tokens.insert(tokens.end(), s.answer.begin(), s.answer.end());
    sequences.emplace_back(tokens.end() - static_cast<std::ptrdiff_t>(len), tokens.end());
    // Answer token i sits at len - |answer| + i of the cut sequence; the position before it
    // predicts it.
    std::vector<int64_t> positions;
    for (int64_t i : eval::generated_answer_indices(s))
      positions.push_back(static_cast<int64_t>(len - s.answer.size()) + i - 1);
    o.answer_positions.push_back(positions);
  }
  o.measure = measure;
  if (!calib::measure_traits(measure).scores_answers) o.answer_positions.clear();
  o.ladder.levels = policy.window_levels;
  o.global_budget_bytes = eval::global_kv_bytes(model.spec(), policy.head_windows(), options);
  o.sink_tokens = options.sink_tokens;
  o.head_bytes = [options](const arch::LayerSpec& layer, int64_t window) {
    return memory::head_bytes(*layer.attention, window, options);
  };
  o.conditioned = false;
  return calib::run_seqcalib(model, sequences, o);
}

}  // namespace

TEST_CASE("eval's own unconditioned ablation is calibrated with the policy's measure", "[eval]") {
  // A policy made with the default measure (or its KL form), as `calibrate` records it.
  const std::string recorded = GENERATE(as<std::string>{}, "answer-tv-span", "answer-kl-span");
  INFO(recorded);
  const auto dir = headwise::testing::fixture_dir("qwen3_next_tiny");
  const auto spec = arch::load_model_spec(dir);
  auto model = arch::load_model(dir, arch::ModelOptions{});
  policy::Policy policy = fixture_policy(dir, {{1, {32, kFullWindow}}, {3, {kFullWindow, 8}}});
  policy.calibration = {{"method", "seqcalib"}, {"distortion_measure", recorded}};
  memory::MemoryOptions options = policy.memory_options();
  options.batch = 1;  // as eval runs it
  const auto samples = eval::make_eval_samples(
      dir, spec.vocab_size, eval::TaskRequest{{}, 2, 120, /*seed=*/0x9e3779b97f4a7c15ull});

  const eval::BaselineInputs in{policy, options, 0, {}, nullptr};
  const eval::MethodWindows built = eval::build_method(*model, in, "unconditioned", samples);
  INFO(built.details.dump());
  const calib::DistortionMeasure measure = calib::parse_distortion_measure(recorded);
  const auto expected = unconditioned_here(*model, policy, options, samples, measure);
  CHECK(built.windows == expected.windows);
  // block-mse, what eval used for these policies before: it decides otherwise on this model and
  // these bytes, so the check above tells the two apart.
  const auto block_mse =
      unconditioned_here(*model, policy, options, samples, calib::DistortionMeasure::kBlockMse);
  REQUIRE(block_mse.windows != expected.windows);
  // The row says which measure made it.
  CHECK(built.details.value("distortion_measure", "") == recorded);
}

TEST_CASE("eval's own unconditioned ablation of a block-mse policy stays block-mse", "[eval]") {
  // block-mse is recorded by its formula's name; a policy from before the answer measures
  // records no measure at all. Both are calibrated with block-mse.
  const std::string recorded = GENERATE(as<std::string>{}, "block_output_relative_mse", "");
  INFO("recorded: '" << recorded << "'");
  const auto dir = headwise::testing::fixture_dir("qwen3_next_tiny");
  const auto spec = arch::load_model_spec(dir);
  auto model = arch::load_model(dir, arch::ModelOptions{});
  policy::Policy policy = fixture_policy(dir, {{1, {32, kFullWindow}}, {3, {kFullWindow, 8}}});
  if (!recorded.empty()) policy.calibration = {{"distortion_measure", recorded}};
  memory::MemoryOptions options = policy.memory_options();
  options.batch = 1;
  const auto samples =
      eval::make_eval_samples(dir, spec.vocab_size, eval::TaskRequest{{}, 2, 120, /*seed=*/3});
  const eval::BaselineInputs in{policy, options, 0, {}, nullptr};
  const eval::MethodWindows built = eval::build_method(*model, in, "unconditioned", samples);
  CHECK(built.details.value("distortion_measure", "") == "block-mse");
  CHECK(built.windows ==
        unconditioned_here(*model, policy, options, samples, calib::DistortionMeasure::kBlockMse)
            .windows);
}

TEST_CASE("eval's own unconditioned ablation refuses a measure it does not know, naming the flags",
          "[eval]") {
  const auto dir = headwise::testing::fixture_dir("qwen3_next_tiny");
  const auto spec = arch::load_model_spec(dir);
  auto model = arch::load_model(dir, arch::ModelOptions{});
  policy::Policy policy = fixture_policy(dir, {{1, {32, kFullWindow}}, {3, {kFullWindow, 8}}});
  policy.calibration = {{"distortion_measure", "answer-from-the-future"}};
  const auto samples =
      eval::make_eval_samples(dir, spec.vocab_size, eval::TaskRequest{{}, 1, 120, /*seed=*/3});
  const eval::BaselineInputs in{policy, policy.memory_options(), 0, {}, nullptr};
  try {
    (void)eval::build_method(*model, in, "unconditioned", samples);
    FAIL("accepted");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Contains("--baselines unconditioned") &&
                             Catch::Contains("'answer-from-the-future'") &&
                             Catch::Contains("--unconditioned-policy"));
  }
}
