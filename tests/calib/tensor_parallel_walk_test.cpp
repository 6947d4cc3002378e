// The walk under --tensor-parallel-size (issue 57, calib/walk/shard_constraint.hpp): each layer
// is decided among the assignments whose tensor-parallel shards hold the same windows, so the
// layers above are measured on the stream that will be served.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "../arch/fixture_reference.hpp"
#include "headwise/calib/calibration_job.hpp"
#include "headwise/calib/calibration_options.hpp"
#include "headwise/memory/tensor_parallel.hpp"

using namespace headwise;

namespace {

// The Qwen3-Next layout with 4 KV heads per global layer (layers 1 and 3), at a budget where the
// unconstrained walk gives layer 3 [128, 32, 8, 32]: rank 0 would hold {128, 32}, rank 1 {8, 32}.
calib::CalibrationOutcome calibrate(int64_t tensor_parallel_size, const std::string& distortion,
                                    const std::string& budget = "620000") {
  calib::CalibrationRequest request{{"model", testing::fixture_dir("qwen3_next_vllm").string()},
                                    {"context", "512"},
                                    {"budget", budget},
                                    {"windows", "8,32,128,full"},
                                    {"seq_len", "256"},
                                    {"samples", "4"},
                                    {"keep_rules", "window"},
                                    {"distortion", distortion},
                                    {"tensor_parallel_size", std::to_string(tensor_parallel_size)}};
  calib::CalibrationJob job(calib::parse_calibration_options(request),
                            std::filesystem::temp_directory_path() / "tp-walk.yaml");
  return job.run(calib::RunControl{});
}

bool every_walked_layer_shards(const calib::SeqCalibResult& result, int64_t tensor_parallel_size) {
  for (const auto& layer : result.decision_noise) {
    if (memory::shard_mismatch(layer.windows, tensor_parallel_size)) return false;
  }
  return !result.decision_noise.empty();
}

}  // namespace

TEST_CASE("tensor parallel: the walk decides every layer within the shard constraint", "[calib]") {
  // Without the constraint the walk's own decision of a layer does not shard here, so the check
  // below tests the constrained walk and not the data.
  const auto free = calibrate(1, "answer-tv-span");
  REQUIRE_FALSE(every_walked_layer_shards(free.record.result, 2));

  const auto tp = calibrate(2, "answer-tv-span");
  CHECK(every_walked_layer_shards(tp.record.result, 2));
  REQUIRE(tp.record.tensor_parallel.has_value());
  const auto& fit = *tp.record.tensor_parallel;
  // The completed policy shards as it stands: the post-walk fit moves no head.
  CHECK(fit.walk_already_shards);
  CHECK(fit.heads_moved == 0);
  CHECK(fit.distortion_lost() >= 0.0);
  CHECK(tp.record.result.global_bytes <= tp.record.budget_bytes - tp.record.fixed_bytes);
  CHECK_FALSE(memory::first_unshardable_layer(
      memory::HeadWindows(tp.record.result.windows.begin(), tp.record.result.windows.end()), 2));
}

TEST_CASE("tensor parallel: block-mse's Lagrangian decision keeps the constraint too", "[calib]") {
  // At this budget the walk's completed windows did not shard, and the post-walk fit moved a head.
  const auto tp = calibrate(2, "block-mse", "660000");
  REQUIRE(tp.record.tensor_parallel.has_value());
  CHECK(tp.record.tensor_parallel->heads_moved == 0);
  CHECK_FALSE(memory::first_unshardable_layer(
      memory::HeadWindows(tp.record.result.windows.begin(), tp.record.result.windows.end()), 2));
}
