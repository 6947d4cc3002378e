#pragma once
// A readable account of how a committed policy differs from a freshly produced one, for
// `regen --check`: serving shape, provenance keys, and per layer/KV head the window and the
// head's cache bytes before and after, then the totals.
#include <optional>
#include <string>
#include <vector>

#include "headwise/arch/model_spec.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::regen {

// One line per difference (empty when the policies are equal field by field). `spec` is the
// model both were made for, used to price windows in bytes.
std::vector<std::string> diff_policies(const policy::Policy& committed, const policy::Policy& produced,
                                       const arch::ModelSpec& spec);

// expected_distortion is a float measurement: the same calibration on another CPU (other SIMD
// width, other core count) lands a few ulps to ~1e-5 apart after a few layers. Staleness is
// about inputs and decisions, so --check accepts a committed policy whose text is canonical and
// which equals the produced one in every field except distortions within this relative gap.
inline constexpr double kDistortionNoiseTolerance = 1e-4;

// When `committed_text` (parsed as `committed`) differs from `produced_text` only by
// expected_distortion values within `relative_tolerance`, the largest relative gap; otherwise
// nullopt (windows, bytes, provenance, layout or a larger distortion change).
std::optional<double> distortion_noise_only(const policy::Policy& committed, const std::string& committed_text,
                                            const policy::Policy& produced, const std::string& produced_text,
                                            double relative_tolerance = kDistortionNoiseTolerance);

// First line where two texts differ, as "line N: '<a>' → '<b>'" (for differences the field
// comparison cannot name, e.g. a hand edit of layout only).
std::string first_text_difference(const std::string& committed, const std::string& produced);

}  // namespace headwise::regen
