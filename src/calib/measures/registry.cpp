// The measures' makers by DistortionMeasure (measure.hpp), and what every measure shares.
#include <map>

#include "calib/measures/measure.hpp"
#include "calib/walk/seqcalib_walk.hpp"
#include "headwise/calib/measure_traits.hpp"
#include "headwise/core/error.hpp"

namespace headwise::calib::seqcalib {
namespace {

// A function-local map: makers register from other files' static initialisers, in any order.
std::map<DistortionMeasure, MeasureMaker>& makers() {
  static std::map<DistortionMeasure, MeasureMaker> by_measure;
  return by_measure;
}

}  // namespace

RegisterMeasure::RegisterMeasure(DistortionMeasure measure, MeasureMaker make) {
  HEADWISE_CHECK(makers().emplace(measure, make).second, "measure {} registered twice",
                 measure_traits(measure).name);
}

std::unique_ptr<Measure> make_measure(const RunInputs& in, RunState& state) {
  const auto it = makers().find(in.options.measure);
  HEADWISE_CHECK(it != makers().end(), "no measure registered for {}",
                 measure_traits(in.options.measure).name);
  return it->second(in, state);
}

void run_layer_at(const RunInputs& in, int64_t layer, const std::vector<int64_t>& windows,
                  ActivationStream& stream) {
  PolicyAttentionCore core({{layer, windows}}, in.options.sink_tokens, in.model.attention_chunk());
  stream.apply([&](const at::Tensor& h) { return run_checked(in, layer, h, core); });
}

}  // namespace headwise::calib::seqcalib
