// The policy a calibration writes: its windows and rules, its bytes, and where it came from.
#include "calib/job/policy_assembly.hpp"

#include <fmt/format.h>

#include "calib/noise/noise_json.hpp"
#include "headwise/arch/context_guard.hpp"
#include "headwise/calib/measure_traits.hpp"
#include "headwise/core/error.hpp"

namespace headwise::calib {
namespace {
namespace fs = std::filesystem;

std::string model_name_of(const fs::path& dir, const arch::ModelSpec& spec) {
  const fs::path clean = dir.filename().empty() ? dir.parent_path() : dir;
  return clean.filename().string().empty() ? spec.model_type : clean.filename().string();
}

// policy.calibration: the options' kRecorded fields and where the data and the run came from.
nlohmann::json provenance(const CalibrationJob::State& s, const AnswerSpan* span) {
  const CalibrationOptions& r = s.options;
  nlohmann::json calibration = {
      {"tool", fmt::format("headwise-calc {}", HEADWISE_VERSION)},
      {"dataset", s.data.description},
      {"dataset_sha256", s.data.sha256},
      {"inputs_sha256", s.inputs.hash},
  };
  record_options(r, calibration);
  if (measure_traits(r.distortion).scores_answers)
    calibration["answer_positions"] = s.data.answer_rule;
  if (span) calibration["answer_span"]["first_position"] = span->span_begin();
  if (s.context_warning) {
    // Recorded so whoever deploys the policy sees it, not only whoever ran the calibration.
    calibration["context_beyond_max_position_embeddings"] =
        arch::context_limit(s.spec).max_position_embeddings;
  }
  if (!s.unmeasured.empty()) calibration["extrapolated_levels"] = s.unmeasured;
  // samples is the last round's; these say the rule chose it.
  if (s.auto_samples) calibration["samples_auto"] = {{"cap", r.samples_cap}, {"rounds", s.rounds}};
  return calibration;
}

// --decisions stable: per layer, how sure the walk's and the keep rules' decisions are
// (noise/noise_json.hpp), where the user reads the policy. Not under point: the key would change
// the bytes of every policy calibrated before it, the committed ones included (regen --check
// compares them), and the report has the whole bootstrap for any run.
void record_decision_noise(const SeqCalibResult& result, const std::optional<KeepRuleResult>& rules,
                           nlohmann::json& calibration) {
  nlohmann::json summary = noise::decision_noise_summary(
      result.decision_noise, rules ? rules->noise : std::vector<KeepRuleNoise>{});
  if (!summary.empty()) calibration["decision_noise"] = std::move(summary);
}

}  // namespace

policy::Policy assemble_policy(const CalibrationJob::State& s, const SeqCalibResult& result,
                               const std::optional<KeepRuleResult>& rules, const AnswerSpan* span) {
  const CalibrationOptions& r = s.options;
  policy::Policy policy;
  policy.model_name = model_name_of(s.dir, s.spec);
  policy.model_path = s.model_path;
  policy.fingerprint = s.fingerprint;
  policy.budget_gb = static_cast<double>(r.budget) / static_cast<double>(int64_t{1} << 30);
  policy.context = s.mem.context;
  policy.batch = s.mem.batch;
  policy.dtype = s.mem.kv_dtype;
  policy.state_dtype = s.mem.state_dtype;
  policy.block_size = s.mem.block_size;
  policy.sink_tokens = s.mem.sink_tokens;
  policy.window_levels = r.windows.levels;
  policy.calibration = provenance(s, span);
  if (r.decisions == "stable") record_decision_noise(result, rules, policy.calibration);
  if (r.tensor_parallel_size > 1) policy.tensor_parallel_size = r.tensor_parallel_size;
  for (const auto& [layer_id, windows] : result.windows) {
    if (rules) {
      policy.per_layer_policies.push_back({layer_id, rules->windows.at(layer_id),
                                           result.expected_distortion.at(layer_id),
                                           rules->rules.at(layer_id)});
    } else {
      policy.per_layer_policies.push_back(
          {layer_id, windows, result.expected_distortion.at(layer_id), {}});
    }
  }
  policy::fill_memory(policy, s.spec);
  policy.engine = engine_record(*s.engine, policy.head_windows());
  const int64_t counted = policy.engine ? policy.engine->total_bytes : policy.memory.total_bytes;
  HEADWISE_CHECK(counted <= r.budget, "policy total {} exceeds budget {}", counted, r.budget);
  return policy;
}

}  // namespace headwise::calib
