// The calibration's memory plan: the host headroom it checks against must be the cgroup's when a
// container or systemd caps the process, not the machine's free memory; the answer-span plans
// hold a second layer only while it fits.
#include <catch2/catch.hpp>

#include <fstream>

#include "../arch/fixture_reference.hpp"
#include "../support/temp_dir.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/calib/memory_plan.hpp"

using namespace headwise;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

}  // namespace

TEST_CASE("the cgroup v2 limit and anonymous memory are read from the process's own cgroup",
          "[calib]") {
  testing::TempDir dir("cgroup2");
  write(dir / "proc", "0::/user.slice/job.scope\n");
  write(dir / "sys/user.slice/job.scope/memory.max", "8589934592\n");
  write(dir / "sys/user.slice/job.scope/memory.stat",
        "anon 1073741824\nfile 4294967296\nkernel 1000\n");
  const auto m = calib::cgroup_memory_from(dir / "proc", dir / "sys");
  REQUIRE(m);
  CHECK(m->limit_bytes == 8589934592);
  CHECK(m->anonymous_bytes == 1073741824);  // the file cache (mapped weights) is reclaimable

  write(dir / "sys/user.slice/job.scope/memory.max", "max\n");
  CHECK_FALSE(calib::cgroup_memory_from(dir / "proc", dir / "sys"));
}

TEST_CASE("the cgroup v1 memory hierarchy is found among the others, and 'no limit' is no limit",
          "[calib]") {
  testing::TempDir dir("cgroup1");
  write(dir / "proc", "9:name=systemd:/\n5:devices:/\n4:memory:/jobs/a\n1:cpu,cpuacct:/\n0::/\n");
  write(dir / "sys/memory/jobs/a/memory.limit_in_bytes", "4294967296\n");
  write(dir / "sys/memory/jobs/a/memory.stat",
        "cache 100\nrss 5\ntotal_cache 300\ntotal_rss 536870912\n");
  const auto m = calib::cgroup_memory_from(dir / "proc", dir / "sys");
  REQUIRE(m);
  CHECK(m->limit_bytes == 4294967296);
  CHECK(m->anonymous_bytes == 536870912);

  write(dir / "sys/memory/jobs/a/memory.limit_in_bytes", "9223372036854771712\n");
  CHECK_FALSE(calib::cgroup_memory_from(dir / "proc", dir / "sys"));
}

TEST_CASE("a container that sees its own cgroup as / reads the limit at the mount", "[calib]") {
  testing::TempDir dir("cgroupns");
  write(dir / "proc", "0::/\n");
  write(dir / "sys/memory.max", "2147483648\n");
  write(dir / "sys/memory.stat", "anon 0\n");
  const auto m = calib::cgroup_memory_from(dir / "proc", dir / "sys");
  REQUIRE(m);
  CHECK(m->limit_bytes == 2147483648);
  CHECK_FALSE(calib::cgroup_memory_from(dir / "missing", dir / "sys"));
}

TEST_CASE("the host headroom never exceeds MemAvailable", "[calib]") {
  const auto available = calib::available_host_bytes();
  REQUIRE(available);
  CHECK(*available > 0);
}

TEST_CASE(
    "answer-span plans keep the measured layer resident only while it fits, and say what they need",
    "[calib]") {
  arch::ModelOptions options;
  auto model = arch::load_model(testing::fixture_dir("qwen3_next_tiny"), options);
  calib::CalibrationShape shape{2, 64, 1, 16, 3, 4};
  shape.answer_span = true;
  const auto plan_with = [&](std::optional<int64_t> available) {
    return calib::plan_calibration_memory(model->spec(), model->checkpoint(), shape, true,
                                          available);
  };
  const calib::MemoryPlan unknown = plan_with(std::nullopt);
  REQUIRE(unknown.measured_layer_weight_bytes > 0);
  CHECK(unknown.measured_layer_resident);
  const int64_t both = unknown.device_peak_bytes();
  const int64_t one = both - unknown.measured_layer_weight_bytes;

  const calib::MemoryPlan roomy = plan_with(both);
  CHECK(roomy.measured_layer_resident);
  CHECK(roomy.device_peak_bytes() == both);

  const calib::MemoryPlan tight = plan_with(both - 1);
  CHECK_FALSE(tight.measured_layer_resident);
  CHECK(tight.device_peak_bytes() == one);
  CHECK(tight.to_json().at("measured_layer_resident") == false);
  CHECK(tight.describe().find("released during its sweeps") != std::string::npos);

  // Even one layer does not fit: the plan names the smaller need, which the refusal prints.
  const calib::MemoryPlan too_small = plan_with(one / 2);
  CHECK_FALSE(too_small.measured_layer_resident);
  CHECK(too_small.device_peak_bytes() == one);

  shape.answer_span = false;  // the other measures hold one layer at a time
  const calib::MemoryPlan block = plan_with(one / 2);
  CHECK(block.measured_layer_weight_bytes == 0);
  CHECK(block.device_peak_bytes() < one);
}
