// The `unconditioned` ablation: the exact one checked (--unconditioned-policy), or calibrated here.
#include "unconditioned.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "headwise/calib/seqcalib.hpp"
#include "headwise/core/error.hpp"

namespace headwise::eval {
namespace {

// The samples as SeqCalib sequences, and per sequence the positions that predict its generated
// answer tokens (answer token i sits at len - |answer| + i of the cut sequence).
struct CalibrationSequences {
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<int64_t>> answer_positions;
};

CalibrationSequences calibration_sequences(const std::vector<EvalSample>& calibration) {
  size_t len = std::numeric_limits<size_t>::max();
  for (const auto& s : calibration) len = std::min(len, s.prompt.size() + s.answer.size());
  CalibrationSequences out;
  for (const auto& s : calibration) {
    std::vector<int64_t> seq = s.prompt;
    seq.insert(seq.end(), s.answer.begin(), s.answer.end());
    // Keep the end (the query and its answer): cut from the front.
    out.tokens.emplace_back(seq.end() - static_cast<std::ptrdiff_t>(len), seq.end());
    std::vector<int64_t> positions;
    for (int64_t i : generated_answer_indices(s)) {
      positions.push_back(static_cast<int64_t>(len - s.answer.size()) + i - 1);
    }
    out.answer_positions.push_back(std::move(positions));
  }
  return out;
}

}  // namespace

calib::DistortionMeasure calibrated_measure(const policy::Policy& policy) {
  // block-mse is recorded by its formula's name, not the option's, and policies older than the
  // answer measures record none: both mean block-mse. Every other name is the calib API's.
  const std::string recorded = policy.calibration.value("distortion_measure", "");
  if (recorded.empty() || recorded == "block_output_relative_mse")
    return calib::DistortionMeasure::kBlockMse;
  try {
    return calib::parse_distortion_measure(recorded);
  } catch (const InputError&) {
    throw_field_error("baselines",
                      " unconditioned: the policy's calibration.distortion_measure '{}' is not a "
                      "measure this headwise-calc knows; pass {} instead",
                      recorded, field_ref("unconditioned_policy"));
  }
}

memory::HeadWindows calibrate_unconditioned(arch::DecoderModel& model, const BaselineInputs& in,
                                            const std::vector<EvalSample>& calibration,
                                            int64_t budget) {
  CalibrationSequences data = calibration_sequences(calibration);
  calib::SeqCalibOptions o;
  // The ablation of the policy: its own measure (the default answer-tv-span as much as
  // answer-kl), only the conditioning removed. The answer measures score each sample's answer
  // there; block-mse does not read the positions (as in `calibrate`, which always passes them).
  o.measure = calibrated_measure(in.policy);
  o.answer_positions = std::move(data.answer_positions);
  o.ladder.levels = in.policy.window_levels;
  o.global_budget_bytes = budget;
  o.sink_tokens = in.options.sink_tokens;
  const memory::MemoryOptions mem = in.options;
  o.head_bytes = [mem](const arch::LayerSpec& layer, int64_t window) {
    return memory::head_bytes(*layer.attention, window, mem);
  };
  o.conditioned = false;
  return calib::run_seqcalib(model, data.tokens, o).windows;
}

void check_unconditioned_ablation(const policy::Policy& policy, const policy::Policy& ablation,
                                  const std::string& where) {
  const std::string method = ablation.calibration.value("method", "");
  if (method != "unconditioned") {
    throw_field_error("unconditioned_policy",
                      " {}: calibration.method is '{}', not 'unconditioned' (calibrate it with {})",
                      where, method, field_ref("no_conditioning"));
  }
  const auto differs = [&](const char* field) {
    throw_field_error(
        "unconditioned_policy",
        " {}: {} differs from {}'s; it must be the same calibration with only {} added", where,
        field, field_ref("policy"), field_ref("no_conditioning"));
  };
  if (ablation.window_levels != policy.window_levels) differs("window_levels");
  if (ablation.context != policy.context) differs("context");
  if (ablation.batch != policy.batch) differs("batch");
  if (ablation.dtype != policy.dtype) differs("dtype");
  if (ablation.state_dtype != policy.state_dtype) differs("state_dtype");
  if (ablation.block_size != policy.block_size) differs("block_size");
  if (ablation.sink_tokens != policy.sink_tokens) differs("sink_tokens");
  if (ablation.budget_gb != policy.budget_gb) differs("budget_gb");
  for (const char* key : {"dataset_sha256", "samples", "seq_len", "seed", "distortion_measure",
                          "heads", "probe_samples"}) {
    const auto a = ablation.calibration.find(key);
    const auto p = policy.calibration.find(key);
    const bool in_a = a != ablation.calibration.end();
    const bool in_p = p != policy.calibration.end();
    if (in_a != in_p || (in_a && *a != *p)) differs((std::string("calibration.") + key).c_str());
  }
}

}  // namespace headwise::eval
