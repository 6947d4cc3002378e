#include "calib/job/post_walk_fits.hpp"

#include <spdlog/spdlog.h>

#include "headwise/calib/engine.hpp"
#include "headwise/core/units.hpp"

namespace headwise::calib {
namespace {

// A fit after the walk (vLLM's reservation, the shard constraint) is the policy from then on: the
// result's windows, their distortions, bytes and total all say what the fit chose, so the report
// states the policy that is written.
void take_fit(SeqCalibResult& result, std::map<int64_t, std::vector<int64_t>> windows,
              std::map<int64_t, std::vector<double>> expected_distortion, int64_t global_bytes,
              double total_distortion) {
  result.windows = std::move(windows);
  result.expected_distortion = std::move(expected_distortion);
  result.global_bytes = global_bytes;
  result.total_distortion = total_distortion;
}

double summed_distortion(const std::map<int64_t, std::vector<double>>& expected_distortion) {
  double total = 0.0;
  for (const auto& [layer, heads] : expected_distortion) {
    for (double d : heads) total += d;
  }
  return total;
}

}  // namespace

EngineFitRecord fit_to_vllm(const CalibrationJob::State& s, SeqCalibResult& result) {
  EngineFit fit = fit_to_engine(*s.engine, result.curves, result.windows,
                                result.expected_distortion, s.options.budget);
  spdlog::info("vLLM's reservation: {} of {} budget (full KV {}), {} heads moved by the fit",
               format_bytes(fit.total_bytes), format_bytes(s.options.budget),
               format_bytes(s.engine->full()), fit.heads_moved);
  // A fit that moves no head keeps the completion's total as the solver summed it.
  const double total =
      fit.heads_moved == 0 ? result.total_distortion : summed_distortion(fit.expected_distortion);
  const EngineFitRecord record{fit.heads_moved, fit.total_bytes, result.total_distortion, total};
  take_fit(result, std::move(fit.windows), std::move(fit.expected_distortion),
           fit.total_bytes - s.fixed, total);
  return record;
}

TensorParallelFit fit_to_shards(const CalibrationJob::State& s, SeqCalibResult& result) {
  const CalibrationOptions& r = s.options;
  TensorParallelFit tp =
      fit_tensor_parallel(result.curves, result.windows, result.expected_distortion,
                          r.tensor_parallel_size, r.budget - s.fixed);
  spdlog::info(
      "tensor parallel {}: {} (curves' distortion {:.6g}; unconstrained optimum {:.6g} at the "
      "same budget: {:.6g} lost), {} heads moved",
      tp.tensor_parallel_size,
      tp.walk_already_shards && tp.heads_moved == 0 ? "the walk's windows shard"
                                                    : "windows re-solved to shard",
      tp.distortion, tp.unconstrained_distortion, tp.distortion_lost(), tp.heads_moved);
  take_fit(result, tp.windows, tp.expected_distortion, tp.global_bytes, tp.distortion);
  return tp;
}

}  // namespace headwise::calib
