#include "headwise/calib/extrapolation.hpp"

#include <algorithm>
#include <cmath>

#include "headwise/core/error.hpp"
#include "headwise/core/window.hpp"

namespace headwise::calib {
namespace {

bool contains(const std::vector<int64_t>& windows, int64_t w) {
  return std::find(windows.begin(), windows.end(), w) != windows.end();
}

// The power-law reading of one head's curve at every unmeasured option.
void fit_power_law(solve::Group& group, const std::vector<int64_t>& unmeasured) {
  std::vector<double> xs, ys;
  double at_largest = 0.0;  // the measured finite level with the largest window
  int64_t largest = -1;
  for (const auto& o : group.options) {
    if (o.window == kFullWindow || contains(unmeasured, o.window)) continue;
    if (o.window > largest) {
      largest = o.window;
      at_largest = o.distortion;
    }
    if (o.distortion > 0.0) {
      xs.push_back(std::log(static_cast<double>(o.window)));
      ys.push_back(std::log(o.distortion));
    }
  }
  double slope = 0.0, intercept = 0.0;
  const bool fitted = xs.size() >= 2;
  if (fitted) {
    const auto n = static_cast<double>(xs.size());
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      sx += xs[i];
      sy += ys[i];
      sxx += xs[i] * xs[i];
      sxy += xs[i] * ys[i];
    }
    slope = std::min(0.0, (n * sxy - sx * sy) / (n * sxx - sx * sx));
    intercept = (sy - slope * sx) / n;
  }
  for (auto& o : group.options) {
    if (!contains(unmeasured, o.window)) continue;
    const double value =
        fitted ? std::exp(intercept + slope * std::log(static_cast<double>(o.window))) : at_largest;
    o.distortion = std::clamp(value, 0.0, at_largest);
  }
}

}  // namespace

Extrapolation parse_extrapolation(const std::string& text) {
  if (text == "none") return Extrapolation::kNone;
  if (text == "as-full") return Extrapolation::kAsFull;
  if (text == "power-law") return Extrapolation::kPowerLaw;
  throw_field_error("extrapolate", ": '{}' is not one of none, as-full, power-law", text);
}

const char* extrapolation_name(Extrapolation rule) {
  switch (rule) {
    case Extrapolation::kNone:
      return "none";
    case Extrapolation::kAsFull:
      return "as-full";
    case Extrapolation::kPowerLaw:
      return "power-law";
  }
  return "?";
}

void extrapolate_curves(std::vector<solve::Group>& groups, const std::vector<int64_t>& unmeasured,
                        Extrapolation rule) {
  if (rule != Extrapolation::kPowerLaw || unmeasured.empty()) return;
  for (auto& group : groups) fit_power_law(group, unmeasured);
}

}  // namespace headwise::calib
