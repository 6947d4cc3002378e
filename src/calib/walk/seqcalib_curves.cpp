#include "calib/walk/seqcalib_curves.hpp"

#include <algorithm>
#include <cmath>

#include "headwise/calib/curve_groups.hpp"
#include "headwise/calib/extrapolation.hpp"
#include "headwise/core/error.hpp"

namespace headwise::calib::seqcalib {

std::vector<solve::Group> layer_groups(const arch::LayerSpec& layer,
                                       const measure::DistortionAccumulator& acc,
                                       const SeqCalibOptions& options) {
  std::vector<solve::Group> groups;
  for (int64_t h = 0; h < layer.attention->num_kv_heads; ++h) {
    solve::Group group{layer.id, h, {}};
    for (size_t l = 0; l < options.ladder.size(); ++l) {
      const int64_t window = options.ladder.levels[l];
      group.options.push_back(
          {window, options.head_bytes(layer, window), acc.distortion(h, static_cast<int64_t>(l))});
    }
    groups.push_back(std::move(group));
  }
  extrapolate_curves(groups, options.unmeasured_levels, options.extrapolation);
  return groups;
}

std::vector<HeadCurve> to_curves(const std::vector<solve::Group>& groups) {
  std::vector<HeadCurve> curves;
  for (const auto& g : groups) {
    HeadCurve c{g.layer_id, g.kv_head, {}, {}, {}};
    for (const auto& o : g.options) {
      c.windows.push_back(o.window);
      c.bytes.push_back(o.bytes);
      c.distortion.push_back(o.distortion);
    }
    curves.push_back(std::move(c));
  }
  return curves;
}

MeasureCheck measure_check(int64_t layer, int64_t head, std::vector<int64_t> windows,
                           double predicted, double measured) {
  MeasureCheck c;
  c.layer_id = layer;
  c.kv_head = head;
  c.windows = std::move(windows);
  c.predicted = predicted;
  c.measured = measured;
  return c;
}

std::vector<solve::Group> marginal_groups(const RunInputs& in, int64_t layer_id,
                                          const std::vector<size_t>& at, const JointMeasure& joint,
                                          const JointPrefetch& prefetch) {
  const auto& layer = in.spec.layer(layer_id);
  const size_t top = in.options.ladder.size() - 1;
  if (prefetch) prefetch(marginal_assignments(in, at));
  std::vector<solve::Group> groups;
  for (size_t h = 0; h < at.size(); ++h) {
    std::vector<size_t> probe = at;
    probe[h] = top;
    const double base = joint(probe);
    solve::Group group{layer_id, static_cast<int64_t>(h), {}};
    for (size_t l = 0; l <= top; ++l) {
      probe[h] = l;
      const int64_t window = in.options.ladder.levels[l];
      // Below 0 is measurement noise (a cut that "helps"); the solver needs d >= 0.
      group.options.push_back(
          {window, in.options.head_bytes(layer, window), std::max(0.0, joint(probe) - base)});
    }
    groups.push_back(std::move(group));
  }
  extrapolate_curves(groups, in.options.unmeasured_levels, in.options.extrapolation);
  return groups;
}

std::vector<std::vector<size_t>> every_assignment(const RunInputs& in, size_t heads) {
  const size_t levels = in.options.ladder.size();
  size_t count = 1;
  for (size_t h = 0; h < heads; ++h) {
    count *= levels;
    if (count > kEnumeratedAssignments) return {};
  }
  std::vector<std::vector<size_t>> all;
  for (size_t index = 0; index < count; ++index) {
    std::vector<size_t> levels_of(heads);
    for (size_t h = 0, rest = index; h < heads; ++h, rest /= levels) levels_of[h] = rest % levels;
    all.push_back(std::move(levels_of));
  }
  return all;
}

std::vector<std::vector<size_t>> marginal_assignments(const RunInputs& in,
                                                      const std::vector<size_t>& at) {
  std::vector<std::vector<size_t>> all;
  for (size_t h = 0; h < at.size(); ++h) {
    for (size_t l = 0; l < in.options.ladder.size(); ++l) {
      all.push_back(at);
      all.back()[h] = l;
    }
  }
  return all;
}

std::vector<std::vector<size_t>> unique_assignments(std::vector<std::vector<size_t>> all) {
  std::vector<std::vector<size_t>> out;
  for (auto& a : all) {
    if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(std::move(a));
  }
  return out;
}

JointMeasure joint_measure(const RunInputs& in, AnswerReference& measure, int64_t layer_id,
                           ActivationStream& stream, LevelMemo& memo) {
  return [&in, &measure, layer_id, &stream, &memo](const std::vector<size_t>& levels) {
    const auto it = memo.find(levels);
    if (it != memo.end()) return it->second;
    const double e = measure.evaluate(layer_id, stream, in.windows_of(levels));
    if (!std::isfinite(e)) {
      throw NumericError(
          fmt::format("layer {}: {} is NaN/Inf at windows [{}]: check the layer's weights",
                      layer_id, divergence_label(measure.divergence()), in.labels_of(levels)));
    }
    memo.emplace(levels, e);
    return e;
  };
}

std::vector<solve::Group> answer_probe_groups(const RunInputs& in, int64_t layer_id,
                                              const JointMeasure& measure) {
  const auto heads = static_cast<size_t>(in.spec.layer(layer_id).attention->num_kv_heads);
  return marginal_groups(in, layer_id, std::vector<size_t>(heads, in.options.ladder.size() - 1),
                         measure);
}

JointMeasure with_extrapolated_levels(const SeqCalibOptions& options, JointMeasure measured,
                                      const std::vector<solve::Group>& curves) {
  if (options.extrapolation != Extrapolation::kPowerLaw || options.unmeasured_levels.empty())
    return measured;
  std::vector<std::vector<double>> penalty(curves.size());
  for (size_t h = 0; h < curves.size(); ++h) {
    for (const auto& o : curves[h].options) {
      const bool unmeasured =
          std::find(options.unmeasured_levels.begin(), options.unmeasured_levels.end(), o.window) !=
          options.unmeasured_levels.end();
      penalty[h].push_back(unmeasured ? o.distortion : 0.0);
    }
  }
  return [measured = std::move(measured), penalty](const std::vector<size_t>& levels) {
    double total = measured(levels);
    for (size_t h = 0; h < levels.size(); ++h) total += penalty[h][levels[h]];
    return total;
  };
}

}  // namespace headwise::calib::seqcalib

namespace headwise::calib {

std::vector<solve::Group> curve_groups(const std::vector<HeadCurve>& curves) {
  std::vector<solve::Group> groups;
  for (const auto& c : curves) {
    solve::Group g{c.layer_id, c.kv_head, {}};
    for (size_t l = 0; l < c.windows.size(); ++l)
      g.options.push_back({c.windows[l], c.bytes[l], c.distortion[l]});
    groups.push_back(std::move(g));
  }
  return groups;
}

}  // namespace headwise::calib
