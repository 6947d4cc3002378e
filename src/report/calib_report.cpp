#include "headwise/report/calib_report.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>

#include "calib/noise/noise_json.hpp"
#include "headwise/calib/curve_groups.hpp"
#include "headwise/core/units.hpp"
#include "headwise/core/window.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::report {
namespace {

nlohmann::json window_json(int64_t window) {
  return window == kFullWindow ? nlohmann::json("full") : nlohmann::json(window);
}

}  // namespace

// Each option says whether its distortion was measured or read off the extrapolation rule.
nlohmann::json curves_json(const std::vector<calib::HeadCurve>& curves,
                           const std::vector<int64_t>& extrapolated) {
  nlohmann::json heads = nlohmann::json::array();
  for (const auto& c : curves) {
    nlohmann::json options = nlohmann::json::array();
    for (size_t l = 0; l < c.windows.size(); ++l) {
      const bool rule =
          std::find(extrapolated.begin(), extrapolated.end(), c.windows[l]) != extrapolated.end();
      options.push_back({{"window", window_json(c.windows[l])},
                         {"bytes", c.bytes[l]},
                         {"distortion", c.distortion[l]},
                         {"extrapolated", rule}});
    }
    heads.push_back({{"layer_id", c.layer_id}, {"kv_head", c.kv_head}, {"options", options}});
  }
  return heads;
}

nlohmann::json measure_checks_json(const std::vector<calib::MeasureCheck>& checks) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : checks) {
    nlohmann::json windows = nlohmann::json::array();
    for (int64_t w : c.windows) windows.push_back(window_json(w));
    nlohmann::json check = {{"layer", c.layer_id},
                            {"kv_head", c.kv_head},
                            {"windows", windows},
                            {"predicted", c.predicted},
                            {"measured", c.measured}};
    if (!c.exact_windows.empty()) {
      // The span measure's joint decision against the exact measure's own on the same stream.
      nlohmann::json own = nlohmann::json::array();
      for (int64_t w : c.exact_windows) own.push_back(window_json(w));
      check["exact_decision_windows"] = own;
      check["exact_decision_measured"] = c.exact_measured;
    }
    out.push_back(std::move(check));
  }
  return out;
}

// A cheap measure's predictions (answer-grad, the answer-span measures) against the exact measure:
// the probe's (head, level) pairs with their rank correlation, and each layer's chosen joint
// windows.
nlohmann::json measure_validation_json(const calib::MeasureValidation& v) {
  return {{"spearman",
           std::isfinite(v.spearman) ? nlohmann::json(v.spearman) : nlohmann::json(nullptr)},
          {"pairs", measure_checks_json(v.pairs)},
          {"joint_decisions", measure_checks_json(v.joint_decisions)},
          {"exact_seconds", v.seconds}};
}

nlohmann::json rate_distortion_curve(const std::vector<calib::HeadCurve>& probe_curves,
                                     int points) {
  const auto groups = calib::curve_groups(probe_curves);
  nlohmann::json curve = nlohmann::json::array();
  if (groups.empty()) return curve;
  const int64_t lo = solve::min_total_bytes(groups), hi = solve::max_window_total_bytes(groups);
  for (int i = 0; i <= points; ++i) {
    const int64_t budget = lo + static_cast<int64_t>(static_cast<double>(hi - lo) * i / points);
    const auto s = solve::solve_exact(groups, budget);
    curve.push_back({{"budget_bytes", budget},
                     {"bytes", s.total_bytes},
                     {"distortion", s.total_distortion},
                     {"lambda", solve::min_fitting_lambda(groups, budget)}});
  }
  return curve;
}

nlohmann::json calibration_report(const calib::SeqCalibResult& r, const ReportContext& c) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : r.layers) {
    nlohmann::json entry{{"layer_id", l.layer_id}, {"kind", l.kind}, {"seconds", l.seconds}};
    if (r.windows.contains(l.layer_id)) {
      nlohmann::json windows = nlohmann::json::array();
      for (int64_t w : r.windows.at(l.layer_id)) windows.push_back(window_json(w));
      entry["kv_head_windows"] = windows;
      entry["expected_distortion"] = r.expected_distortion.at(l.layer_id);
      entry["lambda"] = l.lambda;
      entry["bytes_decided"] = l.bytes_spent;
      entry["bytes_planned_ahead"] = l.planned_ahead;
      if (l.exchanged_bytes > 0) entry["exchanged_bytes"] = l.exchanged_bytes;
    }
    layers.push_back(entry);
  }
  nlohmann::json ladder = nlohmann::json::array();
  for (int64_t w : c.ladder.levels) ladder.push_back(window_json(w));
  // Every (head, level) is either measured on the calibration sequences or given by the rule
  // named in the provenance (`extrapolation`); the levels it covers are listed here.
  nlohmann::json extrapolated = nlohmann::json::array();
  std::vector<int64_t> extrapolated_levels;
  if (c.provenance.contains("extrapolated_levels")) {
    extrapolated = c.provenance["extrapolated_levels"];
    extrapolated_levels = extrapolated.get<std::vector<int64_t>>();
  }
  nlohmann::json answer = nullptr;
  if (r.divergence_walk >= 0) {
    // "answer_kl" names the block (tools read it); with --distortion answer-tv its values are TV.
    const auto divergence = calib::answer_divergence(
        calib::parse_distortion_measure(c.provenance.at("distortion_measure")));
    answer = {{"divergence", divergence == calib::AnswerDivergence::kTv ? "tv" : "kl"},
              {"end_to_end_after_walk", r.divergence_walk},
              {"end_to_end_after_completion", r.divergence_policy},
              {"windows_moved_by_completion", r.windows_moved_by_completion},
              {"rewalks", r.rewalks},
              {"end_to_end_by_pass", r.divergence_by_pass},
              {"resolves", r.resolves},
              {"end_to_end_by_resolve", r.divergence_by_resolve},
              {"span_by_resolve", r.span_by_resolve},
              {"evaluations", r.answer_evaluations}};
  }
  nlohmann::json validation = nullptr;
  if (r.validation) validation = measure_validation_json(*r.validation);
  nlohmann::json report = {
      {"schema", "headwise/calibration-report/v1"},
      {"model_name", c.model_name},
      {"context", c.context},
      {"window_levels", ladder},
      {"budget_bytes", c.budget_bytes},
      {"fixed_bytes", c.fixed_bytes},
      {"global_budget_bytes", c.budget_bytes - c.fixed_bytes},
      {"global_bytes", r.global_bytes},
      {"global_bytes_before_completion", r.global_bytes_before_completion},
      {"total_bytes", c.total_bytes},
      {"full_kv_total_bytes", c.full_kv_total_bytes},
      {"total_distortion", r.total_distortion},
      {"completion_proven_optimal", r.completion_proven_optimal},
      {"probe_lambda", r.probe_lambda},
      {"provenance", c.provenance},
      {"extrapolated_levels", extrapolated},
      {"answer_kl", answer},
      {"measure_validation", validation},
      {"layers", layers},
      {"heads", curves_json(r.curves, extrapolated_levels)},
      {"probe_heads", curves_json(r.probe_curves, extrapolated_levels)},
      {"probe_rate_distortion", rate_distortion_curve(r.probe_curves, 16)},
      {"timing", {{"probe_seconds", r.probe_seconds}, {"total_seconds", r.total_seconds}}},
      {"memory",
       {{"peak_rss_bytes", r.peak_rss_bytes},
        {"peak_device_bytes", r.peak_device_bytes},
        {"activations", r.activations},
        {"plan", c.memory_plan}}},
  };
  // How sure each walked layer's decision is (issue 59); absent for measures that keep no
  // per-sequence values.
  if (!r.decision_noise.empty())
    report["decision_noise"] = calib::noise::decision_noise_json(r.decision_noise, {});
  return report;
}

namespace {

// One hue from dark (the smallest window) to pale (full), evenly spread over the ladder: a
// sequential scale reads as "more memory" at a glance, a rainbow does not. ColorBrewer's Blues.
std::string ladder_colour(size_t level, size_t levels) {
  static const char* kBlues[] = {"#08306b", "#08519c", "#2171b5", "#4292c6",
                                 "#6baed6", "#9ecae1", "#c6dbef", "#deebf7"};
  constexpr size_t kLast = std::size(kBlues) - 1;
  if (levels <= 1) return kBlues[kLast];
  return kBlues[(std::min(level, levels - 1) * kLast + (levels - 1) / 2) / (levels - 1)];
}

// A selecting head's cell is marked with its rule's initial.
char rule_mark(const policy::KeepRule& rule) {
  return rule.name().front();
}

// What a selecting head's slots hold, as the heat map says it.
std::string selected_tokens(const policy::KeepRule& rule) {
  if (rule == policy::KeepRule::kH2O) return "heavy hitters (h2o)";
  return fmt::format("tokens {} selects", rule.name());
}

}  // namespace

std::string window_heatmap_svg(const arch::ModelSpec& spec,
                               const std::map<int64_t, std::vector<int64_t>>& windows,
                               const measure::WindowLadder& ladder, const std::string& title,
                               const std::map<int64_t, std::vector<policy::KeepRule>>& rules) {
  // Short windows dark, full pale: memory-hungry heads stand out as light cells.
  const int cell = 22, left = 90, top = 50, legend_w = 150;
  int64_t max_heads = 1;
  for (const auto& [id, w] : windows)
    max_heads = std::max<int64_t>(max_heads, static_cast<int64_t>(w.size()));
  const auto rows = static_cast<int>(windows.size());
  std::set<policy::KeepRule> selecting;
  for (const auto& layer : rules) {
    for (const auto& rule : layer.second) {
      if (rule.selects_tokens()) selecting.insert(rule);
    }
  }
  std::string legend;
  for (const auto& rule : selecting) {
    legend += fmt::format("; {}: the head's slots hold {}, not a window", rule_mark(rule),
                          selected_tokens(rule));
  }
  const std::string footnote =
      fmt::format("{} global of {} layers; other layers keep their native cache{}", windows.size(),
                  spec.num_layers(), legend);
  // ~8 px per character at 14 px (the title), ~6 at 11 (the footnote): wide enough for both.
  const int width = std::max({left + static_cast<int>(max_heads) * cell + legend_w,
                              16 + 8 * static_cast<int>(title.size()),
                              16 + 6 * static_cast<int>(footnote.size())});
  const int height = top + std::max(rows, static_cast<int>(ladder.size())) * cell + 40;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"8\" y=\"18\" "
      "font-size=\"14\">{}</text>\n"
      "<text x=\"{}\" y=\"{}\">KV head →</text>\n",
      width, height, title, left, top - 22);
  for (int64_t h = 0; h < max_heads; ++h) {
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                       left + static_cast<int>(h) * cell + cell / 2, top - 6, h);
  }
  // A selecting head's slots may have been cut below its level to pay for bookkeeping: the
  // smallest level that holds them (levels are ascending, full largest).
  const auto level_of = [&](int64_t w) {
    const auto it = std::lower_bound(ladder.levels.begin(), ladder.levels.end(), w);
    return static_cast<size_t>(it - ladder.levels.begin());
  };
  const auto rule_of = [&](int64_t layer_id, size_t h) {
    const auto it = rules.find(layer_id);
    return it != rules.end() && h < it->second.size() ? it->second[h] : policy::KeepRule::kWindow;
  };
  int row = 0;
  for (const auto& [layer_id, heads] : windows) {
    const int y = top + row * cell;
    svg += fmt::format("<text x=\"8\" y=\"{}\">layer {}</text>\n", y + 15, layer_id);
    for (size_t h = 0; h < heads.size(); ++h) {
      const size_t level = level_of(heads[h]);
      const policy::KeepRule rule = rule_of(layer_id, h);
      const int x = left + static_cast<int>(h) * cell;
      svg += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" "
          "stroke=\"white\"><title>layer {} "
          "head {}: {}</title></rect>\n",
          x, y, cell, cell, ladder_colour(level, ladder.size()), layer_id, h,
          rule.selects_tokens() ? fmt::format("{} slots of {}", heads[h], selected_tokens(rule))
                                : window_label(heads[h]));
      if (rule.selects_tokens()) {
        // Dark cells (the lower half of the ladder) take white text, pale ones dark.
        const bool dark = 2 * level < ladder.size();
        svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"{}\">{}</text>\n",
                           x + cell / 2, y + 15, dark ? "white" : "#08306b", rule_mark(rule));
      }
    }
    ++row;
  }
  const int lx = left + static_cast<int>(max_heads) * cell + 20;
  for (size_t l = 0; l < ladder.size(); ++l) {
    const int y = top + static_cast<int>(l) * cell;
    svg += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/><text x=\"{}\" "
        "y=\"{}\">{}</text>\n",
        lx, y, cell - 4, cell - 4, ladder_colour(l, ladder.size()), lx + cell + 2, y + 13,
        ladder.levels[l] == kFullWindow ? std::string("full") : format_tokens(ladder.levels[l]));
  }
  svg += fmt::format("<text x=\"8\" y=\"{}\" fill=\"#555\">{}</text>\n", height - 12, footnote);
  svg += "</svg>\n";
  return svg;
}

namespace {

// The end-to-end divergence of the policy as written, where one was measured: the keep-rule pass's
// (it ran the final windows and rules, after any fit), else the completion's unless a fit (vLLM's
// reservation, the shard constraint) moved windows after it; null otherwise.
nlohmann::json written_policy_end_to_end(const calib::CalibrationRecord& r) {
  if (r.keep_rules && r.keep_rules->divergence_final >= 0) return r.keep_rules->divergence_final;
  const bool fitted = (r.engine_fit && r.engine_fit->heads_moved > 0) ||
                      (r.tensor_parallel && r.tensor_parallel->heads_moved > 0);
  if (fitted || r.result.divergence_policy < 0) return nullptr;
  return r.result.divergence_policy;
}

}  // namespace

nlohmann::json calibration_report(const calib::CalibrationOutcome& outcome) {
  const calib::CalibrationRecord& r = outcome.record;
  const policy::Policy& policy = outcome.policy;
  const ReportContext context{policy.model_name,
                              r.context,
                              r.budget_bytes,
                              r.fixed_bytes,
                              policy.memory.total_bytes,
                              policy.memory.full_kv_total_bytes,
                              r.ladder,
                              policy.calibration,
                              r.memory_plan};
  nlohmann::json report = calibration_report(r.result, context);
  report["world_size"] = r.world_size;
  if (r.keep_rules) report["keep_rules"] = calib::keep_rules_json(*r.keep_rules);
  if (report["answer_kl"].is_object())
    report["answer_kl"]["end_to_end_policy"] = written_policy_end_to_end(r);
  if (r.keep_rules && !r.keep_rules->noise.empty()) {
    report["decision_noise"] =
        calib::noise::decision_noise_json(r.result.decision_noise, r.keep_rules->noise);
  }
  if (r.tensor_parallel) {
    const auto& tp = *r.tensor_parallel;
    report["tensor_parallel"] = {{"size", tp.tensor_parallel_size},
                                 {"walk_already_shards", tp.walk_already_shards},
                                 {"heads_moved", tp.heads_moved},
                                 {"walk_distortion", tp.walk_distortion},
                                 {"distortion", tp.distortion},
                                 {"unconstrained_distortion", tp.unconstrained_distortion},
                                 {"unconstrained_bytes", tp.unconstrained_bytes},
                                 {"distortion_lost", tp.distortion_lost()},
                                 {"global_bytes", tp.global_bytes},
                                 {"proven_optimal", tp.proven_optimal}};
  }
  if (r.engine_fit) {
    const auto& fit = *r.engine_fit;
    report["engine_fit"] = {{"engine", "vllm"},
                            {"heads_moved", fit.heads_moved},
                            {"total_bytes", fit.total_bytes},
                            {"walk_distortion", fit.walk_distortion},
                            {"distortion", fit.distortion}};
  }
  report["backend"] = r.backend;
  if (r.world_size > 1) {
    report["distributed"] = {{"rank_sequences", r.result.local_sequences},
                             {"micro_batch", r.micro_batch},
                             {"exchanged_bytes", r.result.exchanged_bytes}};
  }
  return report;
}

std::string calibration_heatmap_svg(const calib::CalibrationOutcome& outcome) {
  const calib::CalibrationRecord& r = outcome.record;
  const policy::Policy& policy = outcome.policy;
  // The policy's heads as served: an h2o head's slots where the pass cut them, marked.
  return window_heatmap_svg(
      r.spec, r.keep_rules ? r.keep_rules->windows : r.result.windows, r.ladder,
      fmt::format("{}: KV-head windows at {} tokens, {} of the {} budget", policy.model_name,
                  format_tokens(r.context), format_bytes(policy.memory.total_bytes),
                  format_bytes(r.budget_bytes)),
      r.keep_rules ? r.keep_rules->rules : std::map<int64_t, std::vector<policy::KeepRule>>{});
}

}  // namespace headwise::report
