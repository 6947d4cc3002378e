// The probe pass: every global layer's curves measured with full KV below, by the run's measure.
// They price the layers the walk has not reached yet (and, unconditioned, decide them).
#include <spdlog/spdlog.h>

#include "calib/measures/measure.hpp"

namespace headwise::calib::seqcalib {

void probe(const RunInputs& in, Measure& measure, RunState& state) {
  const auto start = Clock::now();
  const int64_t samples = measure.probe_samples(in, state);
  measure.probe(in, state);
  std::vector<solve::Group> all;
  for (const auto& [id, groups] : state.probe_groups) append(all, groups);
  state.probe_lambda = solve::min_fitting_lambda(all, in.options.global_budget_bytes);
  state.probe_seconds = seconds_since(start);
  spdlog::info("probe: {} global layers measured on {} sequences in {:.1f}s, lambda {:.4g}",
               state.probe_groups.size(), samples, state.probe_seconds, state.probe_lambda);
}

}  // namespace headwise::calib::seqcalib
