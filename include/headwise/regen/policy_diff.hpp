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
std::vector<std::string> diff_policies(const policy::Policy& committed,
                                       const policy::Policy& produced, const arch::ModelSpec& spec);

// expected_distortion is a float measurement: the same calibration on another CPU (other SIMD
// width) lands a few ulps to ~1e-5 apart after a few layers. Staleness is about inputs and
// decisions, so --check accepts a committed policy whose text is canonical and which equals the
// produced one in every field except distortions within this gap. The gap is relative to the
// layer's scale (the largest |distortion| of any of its heads, committed or produced), not to
// each value: float noise is absolute at the scale of the sums that made it, so a head whose cost
// is 1e-7 of its layer's moves by a large fraction of itself while meaning nothing, and a
// per-value bound would call that drift. A layer's scale is at least kLayerScaleFloor of the
// policy's (its largest distortion): an answer measure is one end-to-end divergence whose float
// noise is absolute at the policy's scale, so a layer that costs the answers almost nothing has
// the same absolute noise as the others (measured: tiny-qwen3-next, layer 1 at 3.4e-5, layer 3 at
// 0.55, both moved by 5e-8 on another CPU, 1.5e-3 of layer 1's own scale).
inline constexpr double kDistortionNoiseTolerance = 1e-4;
inline constexpr double kLayerScaleFloor = 1e-2;

// When `committed_text` (parsed as `committed`) differs from `produced_text` only by
// expected_distortion values within `relative_tolerance` of their layer's scale, the largest such
// gap; otherwise nullopt (windows, bytes, provenance, layout or a larger distortion change).
std::optional<double> distortion_noise_only(const policy::Policy& committed,
                                            const std::string& committed_text,
                                            const policy::Policy& produced,
                                            const std::string& produced_text,
                                            double relative_tolerance = kDistortionNoiseTolerance);

// First line where two texts differ, as "line N: '<a>' → '<b>'" (for differences the field
// comparison cannot name, e.g. a hand edit of layout only).
std::string first_text_difference(const std::string& committed, const std::string& produced);

}  // namespace headwise::regen
