// --engine vllm (calib/engine.hpp): after the walk the policy is fitted to vLLM's exact
// reservation, which can move heads; the report then states the fitted policy, not the walk's.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "../arch/fixture_reference.hpp"
#include "headwise/calib/calibration_job.hpp"
#include "headwise/calib/calibration_options.hpp"
#include "headwise/report/calib_report.hpp"

using namespace headwise;

namespace {

// The Qwen3-Next layout in vLLM's CPU serving shape (the vllm-calib entry's flags), at 2400k: the
// walk, priced per head, spends more than vLLM's coupled reservation allows, and the fit moves two
// heads (found by trying 2000k-3200k; 2600k and 2800k move none).
calib::CalibrationOutcome calibrate_for_vllm() {
  calib::CalibrationRequest request{{"model", testing::fixture_dir("qwen3_next_vllm").string()},
                                    {"context", "4k"},
                                    {"budget", "2400k"},
                                    {"windows", "64,256,1k,full"},
                                    {"samples", "2"},
                                    {"engine", "vllm"},
                                    {"block_size", "128"},
                                    {"max_num_batched_tokens", "256"},
                                    {"kv_dtype", "bfloat16"},
                                    {"state_dtype", "float32"}};
  calib::CalibrationJob job(calib::parse_calibration_options(request),
                            std::filesystem::temp_directory_path() / "engine-fit.yaml");
  return job.run(calib::RunControl{});
}

double policy_distortion(const policy::Policy& p) {
  double total = 0.0;
  for (const auto& layer : p.per_layer_policies) {
    for (double d : layer.expected_distortion) total += d;
  }
  return total;
}

}  // namespace

TEST_CASE("--engine vllm: the report's total distortion and bytes are the fitted policy's",
          "[calib]") {
  const calib::CalibrationOutcome out = calibrate_for_vllm();
  REQUIRE(out.record.engine_fit.has_value());
  const calib::EngineFitRecord& fit = *out.record.engine_fit;
  // Without a moved head the walk's total and the fitted one are the same number.
  REQUIRE(fit.heads_moved > 0);
  CHECK(fit.walk_distortion != Approx(fit.distortion));

  CHECK(out.record.result.total_distortion == fit.distortion);
  CHECK(out.record.result.total_distortion == Approx(policy_distortion(out.policy)).epsilon(1e-12));
  REQUIRE(out.policy.engine.has_value());
  CHECK(fit.total_bytes == out.policy.engine->total_bytes);
  CHECK(fit.total_bytes <= out.record.budget_bytes);
  CHECK(out.record.result.global_bytes == fit.total_bytes - out.record.fixed_bytes);
  for (const auto& layer : out.policy.per_layer_policies)
    CHECK(out.record.result.windows.at(layer.layer_id) == layer.kv_head_windows);

  const nlohmann::json report = report::calibration_report(out);
  CHECK(report.at("total_distortion").get<double>() == fit.distortion);
  CHECK(report.at("engine_fit").at("heads_moved").get<int64_t>() == fit.heads_moved);
  CHECK(report.at("engine_fit").at("walk_distortion").get<double>() == fit.walk_distortion);
  CHECK(report.at("engine_fit").at("total_bytes").get<int64_t>() == fit.total_bytes);
  // The completion's end-to-end value describes the windows before the fit; window rules run no
  // keep-rule pass, so nothing measured the fitted windows end to end, and the report says so.
  CHECK_FALSE(out.record.keep_rules.has_value());
  const nlohmann::json& answer = report.at("answer_kl");
  CHECK(answer.at("end_to_end_after_completion").get<double>() ==
        out.record.result.divergence_policy);
  CHECK(answer.at("end_to_end_policy").is_null());
}
