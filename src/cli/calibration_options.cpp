#include "calibration_options.hpp"

#include "headwise/calib/keep_rules.hpp"
#include "headwise/core/units.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::cli {

calib::CalibrationOptions calibration_options(const calib::CalibrationRequest& r) {
  calib::CalibrationOptions o;
  o.model = r.model;
  o.context = parse_token_count(r.context, "--context");
  if (!r.kv_dtype.empty()) o.kv_dtype = parse_dtype(r.kv_dtype, "--kv-dtype");
  o.state_dtype = r.state_dtype == "native"
                      ? std::nullopt
                      : std::optional(policy::parse_state_dtype(r.state_dtype, "--state-dtype"));
  o.budget = parse_byte_size(r.budget, "--budget");
  o.windows = measure::parse_window_ladder(r.windows, "--windows");
  if (r.seq_len != "auto") o.seq_len = parse_token_count(r.seq_len, "--seq-len");
  o.distortion = calib::parse_distortion_measure(r.distortion);
  o.extrapolate = calib::parse_extrapolation(r.extrapolate);
  o.h2o_keep_rules = calib::parse_keep_rules(calib::resolve_keep_rules(r.keep_rules, o.distortion));
  o.activations = calib::parse_activation_placement(r.activations);
  o.calib = r.calib;
  o.samples = r.samples;
  o.span_margin = r.span_margin;
  o.resolve_by_rewalk = r.resolve_by_rewalk;
  o.independent_heads = r.independent_heads;
  o.validate_measure = r.validate_measure;
  o.prefill_chunk = r.prefill_chunk;
  o.block_size = r.block_size;
  o.batch = r.batch;
  o.sink_tokens = r.sink_tokens;
  o.seed = r.seed;
  o.device = r.device;
  o.dtype = r.dtype;
  o.micro_batch = r.micro_batch;
  o.probe_samples = r.probe_samples;
  o.attention_chunk = r.attention_chunk;
  o.no_conditioning = r.no_conditioning;
  return o;
}

}  // namespace headwise::cli
