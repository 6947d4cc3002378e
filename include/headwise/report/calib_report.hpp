#pragma once
// What a calibration run leaves besides the policy: a JSON report (per-layer conditioned
// curves, the probe's rate–distortion curve, lambdas, timings, peak memory) that `solve` can
// re-solve from, and an SVG heat map of layers x KV heads → window.
#include <nlohmann/json.hpp>

#include <string>

#include "headwise/arch/model_spec.hpp"
#include "headwise/calib/calibration_job.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/measure/window_ladder.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::report {

struct ReportContext {
  std::string model_name;
  int64_t context = 0;
  int64_t budget_bytes = 0;
  int64_t fixed_bytes = 0;
  int64_t total_bytes = 0;
  int64_t full_kv_total_bytes = 0;
  measure::WindowLadder ladder;
  nlohmann::json provenance;
  // calib::MemoryPlan::to_json() plus "rss_before_model_bytes" (null when not planned).
  nlohmann::json memory_plan;
};

// `heads` in the curves-file layout of `headwise-calc solve` (windows as ints or "full").
nlohmann::json curves_json(const std::vector<calib::HeadCurve>& curves);
// The probe's rate–distortion curve: total distortion vs global KV bytes over lambda.
nlohmann::json rate_distortion_curve(const std::vector<calib::HeadCurve>& probe_curves, int points);
nlohmann::json calibration_report(const calib::SeqCalibResult& result,
                                  const ReportContext& context);

// The main command's report.json (calibration_report of the run, its keep rules, ranks and
// backend) and its heat map, from a finished calibration: calib depends on nothing here.
nlohmann::json calibration_report(const calib::CalibrationOutcome& outcome);
std::string calibration_heatmap_svg(const calib::CalibrationOutcome& outcome);

// Layers (rows, global layers only) x KV heads (columns), coloured by ladder level. `rules` (per
// layer, per head; a layer left out keeps windows) marks the heads whose slots hold heavy
// hitters; such a head's slot count may be off the ladder and is coloured as the level it was cut
// from (the smallest level holding it).
std::string window_heatmap_svg(const arch::ModelSpec& spec,
                               const std::map<int64_t, std::vector<int64_t>>& windows,
                               const measure::WindowLadder& ladder, const std::string& title,
                               const std::map<int64_t, std::vector<policy::KeepRule>>& rules = {});

}  // namespace headwise::report
