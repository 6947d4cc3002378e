// The rules for window levels the calibration sequences cannot measure.
#include <catch2/catch.hpp>

#include <cmath>

#include "headwise/calib/extrapolation.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/window.hpp"

using namespace headwise;

namespace {

// One head's curve over `windows`, d(w) given, 1 byte per token.
solve::Group curve(const std::vector<int64_t>& windows, const std::function<double(int64_t)>& d) {
  solve::Group g{3, 0, {}};
  for (int64_t w : windows)
    g.options.push_back({w, w == kFullWindow ? 1 << 20 : w, w == kFullWindow ? 0.0 : d(w)});
  return g;
}

}  // namespace

TEST_CASE("power-law extrapolation recovers a power-law curve at the unmeasured levels",
          "[calib]") {
  // The truth is known: d(w) = 3 w^-0.5 at every level. Measured up to 1K, read at 4K and 16K.
  const auto truth = [](int64_t w) { return 3.0 / std::sqrt(static_cast<double>(w)); };
  const std::vector<int64_t> ladder{64, 256, 1024, 4096, 16384, kFullWindow};
  std::vector<solve::Group> groups{
      curve(ladder, [&](int64_t w) { return w >= 4096 ? 0.0 : truth(w); })};
  calib::extrapolate_curves(groups, {4096, 16384}, calib::Extrapolation::kPowerLaw);
  CHECK(groups[0].options[3].distortion == Approx(truth(4096)).epsilon(1e-12));
  CHECK(groups[0].options[4].distortion == Approx(truth(16384)).epsilon(1e-12));
  CHECK(groups[0].options[2].distortion == truth(1024));  // measured levels are kept
  CHECK(groups[0].options[5].distortion == 0.0);          // full KV costs nothing

  // as-full and none leave the measured reading (that of full KV) as it is.
  std::vector<solve::Group> as_full{
      curve(ladder, [&](int64_t w) { return w >= 4096 ? 0.0 : truth(w); })};
  calib::extrapolate_curves(as_full, {4096, 16384}, calib::Extrapolation::kAsFull);
  CHECK(as_full[0].options[3].distortion == 0.0);
}

TEST_CASE(
    "power-law extrapolation never lets a longer window cost more than a measured shorter one",
    "[calib]") {
  const std::vector<int64_t> ladder{64, 256, 1024, kFullWindow};
  // Rising with the window (noise): slope clamped to 0, the value capped at the largest measured.
  std::vector<solve::Group> rising{
      curve(ladder, [](int64_t w) { return w == 1024 ? 0.0 : 0.001 * static_cast<double>(w); })};
  calib::extrapolate_curves(rising, {1024}, calib::Extrapolation::kPowerLaw);
  CHECK(rising[0].options[2].distortion <= rising[0].options[1].distortion);
  CHECK(rising[0].options[2].distortion >= 0.0);
  // One positive measured level: no decay assumed, its value is used.
  std::vector<solve::Group> one{
      curve({64, 256, 1024, kFullWindow}, [](int64_t w) { return w == 256 ? 0.5 : 0.0; })};
  calib::extrapolate_curves(one, {1024}, calib::Extrapolation::kPowerLaw);
  CHECK(one[0].options[2].distortion == 0.5);
}

TEST_CASE("--extrapolate names its rules", "[calib]") {
  CHECK(calib::parse_extrapolation("power-law") == calib::Extrapolation::kPowerLaw);
  CHECK(std::string(calib::extrapolation_name(calib::Extrapolation::kAsFull)) == "as-full");
  CHECK_THROWS_AS(calib::parse_extrapolation("linear"), InputError);
}
