#pragma once
// After the walk: the exact completion that spends what the controller left, what it does end to
// end, and the passes that re-walk the layers above a lower layer it moved (fresh conditioning)
// or that an exact solve over every layer's conditioned curves moves (cross-layer re-solve).
#include <cstdint>
#include <optional>
#include <vector>

#include <functional>

#include "calib/walk/seqcalib_run.hpp"

namespace headwise::calib::seqcalib {

class Measure;

// A whole policy's end-to-end answer divergence on the calibration sequences (the exact answer
// measures': every layer run over every token under the policy's windows).
using PolicyValue = std::function<double(const Windows& windows)>;

// Exact completion: spend what the controller left on the best upgrades.
void complete(const RunInputs& in, RunState& state);

// Upper layers were measured on the stream of the walk's windows; the completion may lengthen
// some of them afterwards. Measure what that does end to end instead of assuming it.
void measure_completion_effect(const RunInputs& in, const PolicyValue& value, RunState& state);

// Fresh conditioning: re-walks (with `measure`) the layers above the lowest one the completion
// moved while that lowers the policy's value.
void rewalk_while_completion_moves_lower_layers(const RunInputs& in, Measure& measure,
                                                const PolicyValue& value, RunState& state);

// Cross-layer re-solve by re-walks, kept while they lower the policy's value.
void resolve_across_layers(const RunInputs& in, Measure& measure, const PolicyValue& value,
                           RunState& state);

// The exact solve of the whole budget over the conditioned curves, when it moves windows of a
// layer below a global layer: the proposed windows and the lowest layer they change.
struct ResolvedMove {
  int64_t lowest = 0;
  Windows windows;
  std::vector<size_t> choice;  // the solve's option per decided group
};
std::optional<ResolvedMove> propose_resolve(const RunInputs& in, const RunState& state);

// The lowest global layer whose windows differ between `from` and `policy`, when a global layer
// lies above it.
std::optional<int64_t> lowest_changed_layer_below_a_global_layer(const RunInputs& in,
                                                                 const Windows& policy,
                                                                 const Windows& from);

// Fixes the global layers up to `lowest` at `windows`, re-walks the layers above on that stream
// and completes.
void rewalk_above_fixed(const RunInputs& in, Measure& measure, RunState& state, int64_t lowest,
                        const Windows& windows);

}  // namespace headwise::calib::seqcalib
