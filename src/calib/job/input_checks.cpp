#include "calib/job/input_checks.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "calib/rules/joint_rules.hpp"
#include "headwise/calib/measure_traits.hpp"
#include "headwise/calib/prompt_end.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"
#include "headwise/tasks/synthetic.hpp"

namespace headwise::calib {

void refuse_if_it_cannot_fit(const MemoryPlan& plan, std::string_view samples_field, bool limited) {
  spdlog::info("calibration memory: {}", plan.describe());
  if (plan.available_bytes && plan.device_peak_bytes() > *plan.available_bytes) {
    throw InfeasibleFieldError(
        std::string(samples_field),
        fmt::format("calibration needs about {} but only {} is available{}; lower {}, {} "
                    "or {}, or use {} host",
                    format_bytes(plan.device_peak_bytes()), format_bytes(*plan.available_bytes),
                    limited ? fmt::format(" ({})", field_ref("memory_limit")) : "",
                    field_ref(samples_field), field_ref("seq_len"), field_ref("micro_batch"),
                    field_ref("activations")));
  }
}

void refuse_unmeasured_levels(const std::vector<int64_t>& blind, int64_t seq_len,
                              Extrapolation rule) {
  if (blind.empty()) return;
  std::vector<std::string> names;
  for (int64_t w : blind) names.push_back(format_tokens(w));
  const std::string seq_len_name = option_spelling("seq_len"),
                    extrapolate_name = option_spelling("extrapolate");
  switch (rule) {
    case Extrapolation::kNone:
      throw_field_error(
          "windows",
          " levels {} are >= {} {}: calibration sequences that short cannot measure them; use {} "
          "auto (or "
          "longer than {}), drop them from {}, or choose a rule with {} power-law or as-full",
          fmt::join(names, ","), field_ref("seq_len"), seq_len, field_ref("seq_len"),
          format_tokens(blind.back()), field_ref("windows"), field_ref("extrapolate"));
    case Extrapolation::kAsFull:
      spdlog::warn(
          "window levels {} are >= {} {}: not measured; {} as-full gives them full KV's distortion "
          "(0): the "
          "solver prefers them to full KV",
          fmt::join(names, ","), seq_len_name, seq_len, extrapolate_name);
      return;
    case Extrapolation::kPowerLaw:
      spdlog::warn(
          "window levels {} are >= {} {}: not measured; {} {} reads each head's cost there off a "
          "power law "
          "fitted to its measured levels",
          fmt::join(names, ","), seq_len_name, seq_len, extrapolate_name, extrapolation_name(rule));
      return;
  }
}

void refuse_ranks_with_other_inputs(dist::Collective& world, const std::string& inputs_hash) {
  if (world.world_size() == 1) return;
  const auto hashes = world.all_gather(inputs_hash, "the job's inputs");
  for (size_t r = 1; r < hashes.size(); ++r) {
    if (hashes[r] != hashes[0]) {
      throw_input_error(
          "rank {} was started with other inputs than rank 0 (inputs_sha256 {} against {}): every "
          "rank "
          "needs the same flags, model and calibration data",
          r, hashes[r].substr(0, 12), hashes[0].substr(0, 12));
    }
  }
}

void refuse_follow_ups_without_choice(const CalibrationOptions& o,
                                      const std::vector<policy::KeepRule>& rules) {
  if (o.follow_ups < 0) throw_field_error("follow_ups", " must be 0 or more, got {}", o.follow_ups);
  if (o.follow_ups != 0 && !chooses_at_prompt_end(rules)) {
    throw_field_error("follow_ups",
                      " {} needs a rule that chooses at the prompt's end (snap) in {}, which is "
                      "'{}'",
                      o.follow_ups, field_ref("keep_rules"), o.keep_rules);
  }
}

void check_prefill_peak(const CalibrationOptions& o, const std::vector<policy::KeepRule>& rules,
                        size_t global_layers) {
  if (o.prefill_schedule != "whole" && o.prefill_schedule != "layer")
    throw_field_error("prefill_schedule", ": expected whole or layer, got '{}'",
                      o.prefill_schedule);
  if (!o.prefill_peak) {
    if (o.prefill_schedule != "whole")
      throw_field_error("prefill_schedule", " {}: only with {}", o.prefill_schedule,
                        field_ref("prefill_peak"));
    return;
  }
  if (std::find(rules.begin(), rules.end(), policy::KeepRule::kSnap) == rules.end()) {
    throw_field_error("prefill_peak",
                      " bounds what snap heads stage during prefill, and {} '{}' has none (the "
                      "policy's peak is then its steady bytes, which {} bounds)",
                      field_ref("keep_rules"), o.keep_rules, field_ref("budget"));
  }
  if (*o.prefill_peak < o.budget) {
    throw_field_error("prefill_peak",
                      " {} is below {} {}: the peak holds the steady bytes; to hold fewer in "
                      "decode, lower {}",
                      *o.prefill_peak, field_ref("budget"), o.budget, field_ref("budget"));
  }
  joint::refuse_peak_bound_beyond_limit(global_layers);
}

void check_measure_options(const CalibrationOptions& o, bool selecting_rules) {
  const MeasureTraits& measure = measure_traits(o.distortion);
  if (o.validate_measure && !measure.can_validate) {
    throw_field_error("validate_measure",
                      " checks {} answer-grad, answer-tv-span or answer-kl-span against the exact "
                      "measure; got {} {}",
                      field_ref("distortion"), field_ref("distortion"),
                      distortion_measure_name(o.distortion));
  }
  if (o.span_margin < 0)
    throw_field_error("span_margin", " must not be negative, got {}", o.span_margin);
  if (selecting_rules && !measure.scores_answers) {
    throw_field_error("keep_rules",
                      " {}: the rules are measured at the answers; use an answer measure "
                      "({} answer-tv or answer-kl), not {}",
                      o.keep_rules, field_ref("distortion"), distortion_measure_name(o.distortion));
  }
  if (o.prefill_chunk <= 0)
    throw_field_error("prefill_chunk", " must be positive, got {}", o.prefill_chunk);
}

void check_samples(const CalibrationOptions& o) {
  if (o.samples && *o.samples <= 0)
    throw_field_error("samples", " must be positive, got {}", *o.samples);
  if (!o.samples && !measure_traits(o.distortion).runs_on_span) {
    throw_field_error("samples",
                      " auto reads the decision noise of the answer-span measures; use {} "
                      "answer-tv-span or answer-kl-span, not {}",
                      field_ref("distortion"), distortion_measure_name(o.distortion));
  }
}

void check_needles(const CalibrationOptions& o) {
  if (!o.calib.empty()) {
    if (o.needles) {
      throw_field_error("needles", " {} applies to the built-in calibration set, not to {} {}",
                        *o.needles, field_ref("calib"), o.calib);
    }
    return;
  }
  if (!o.needles) return;
  if (*o.needles <= 0) throw_field_error("needles", " must be positive, got {}", *o.needles);
  // The built-in set's own floor: the haystack at least three times the queries' tokens.
  const int64_t needle_tokens = 2 + tasks::kSyntheticKeyLen + tasks::kSyntheticValueLen;
  const int64_t shortest = 4 * *o.needles * needle_tokens;
  if (*o.seq_len < shortest) {
    throw_field_error("needles",
                      " {} do not fit calibration sequences of {} tokens (they need at least {}: "
                      "lower {} or raise {})",
                      *o.needles, *o.seq_len, shortest, field_ref("needles"), field_ref("seq_len"));
  }
}

void refuse_budget_below_minimum(const arch::ModelSpec& spec, const memory::MemoryOptions& mem,
                                 int64_t fixed, const CalibrationOptions& o) {
  int64_t minimum = fixed;
  for (int64_t id : spec.global_layer_ids()) {
    const auto& att = *spec.layer(id).attention;
    minimum += att.num_kv_heads * memory::head_bytes(att, o.windows.levels.front(), mem);
  }
  if (o.budget >= minimum) return;
  throw InfeasibleFieldError(
      "budget", fmt::format("{} {} is below the minimum {} ({} bytes: {} fixed for non-global "
                            "layers + every global KV "
                            "head at {} tokens) at context {}",
                            field_ref("budget"), format_bytes(o.budget), format_bytes(minimum),
                            minimum, format_bytes(fixed), o.windows.levels.front(), mem.context));
}

}  // namespace headwise::calib
