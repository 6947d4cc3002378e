#include "calib/walk/seqcalib_validation.hpp"

#include <spdlog/spdlog.h>

#include "calib/walk/seqcalib_curves.hpp"
#include "headwise/calib/answer_grad.hpp"
#include "headwise/core/window.hpp"

namespace headwise::calib::seqcalib {

void validate_probe_pairs(const RunInputs& in, AnswerReference& exact, int64_t layer_id,
                          ActivationStream& stream, const std::vector<solve::Group>& predicted,
                          MeasureValidation& validation) {
  const auto start = Clock::now();
  LevelMemo memo;
  const std::vector<solve::Group> measured =
      answer_probe_groups(in, layer_id, joint_measure(in, exact, layer_id, stream, memo));
  const size_t top = in.options.ladder.size() - 1;
  for (size_t h = 0; h < predicted.size(); ++h) {
    for (size_t l = 0; l < top; ++l) {
      const int64_t window = in.options.ladder.levels[l];
      validation.pairs.push_back(measure_check(layer_id, static_cast<int64_t>(h), {window},
                                               predicted[h].options[l].distortion,
                                               measured[h].options[l].distortion));
    }
  }
  validation.seconds += seconds_since(start);
}

void validate_span_probe(const RunInputs& in, AnswerReference& exact,
                         const std::map<int64_t, std::vector<solve::Group>>& probe_groups,
                         MeasureValidation& validation) {
  const auto start = Clock::now();
  ActivationStream stream(in.model, in.local_sequences, in.options.micro_batch,
                          in.options.activations);
  arch::ExactAttentionCore exact_core(in.model.attention_chunk());
  const size_t top = in.options.ladder.size() - 1;
  for (int64_t i = 0; i < in.spec.num_layers(); ++i) {
    if (in.spec.layer(i).is_global()) {
      LevelMemo memo;
      const std::vector<solve::Group> measured =
          answer_probe_groups(in, i, joint_measure(in, exact, i, stream, memo));
      const std::vector<solve::Group>& predicted = probe_groups.at(i);
      for (size_t h = 0; h < predicted.size(); ++h) {
        for (size_t l = 0; l < top; ++l) {
          validation.pairs.push_back(
              measure_check(i, static_cast<int64_t>(h), {in.options.ladder.levels[l]},
                            predicted[h].options[l].distortion, measured[h].options[l].distortion));
        }
      }
    }
    stream.apply([&](const at::Tensor& h) {
      return in.model.run_layer(i, h, {&exact_core, nullptr, 0});
    });
    in.model.release_layer(i);
  }
  validation.seconds += seconds_since(start);
}

void validate_joint_decision(const RunInputs& in, AnswerReference& exact, int64_t layer_id,
                             ActivationStream& stream, const std::vector<size_t>& assign,
                             const JointMeasure& predicted, const std::vector<solve::Group>& groups,
                             int64_t allowance, double price, bool with_own_decision,
                             RunState& state) {
  const auto start = Clock::now();
  LevelMemo memo;
  const auto measured = joint_measure(in, exact, layer_id, stream, memo);
  const std::vector<size_t> all_top(assign.size(), in.options.ladder.size() - 1);
  MeasureCheck check =
      measure_check(layer_id, -1, in.windows_of(assign), predicted(assign) - predicted(all_top),
                    measured(assign) - measured(all_top));
  if (with_own_decision && in.options.joint_heads) {
    const std::vector<size_t> own = greedy_joint_descent(
        groups, allowance, with_extrapolated_levels(in.options, measured, groups), price);
    check.exact_windows = in.windows_of(own);
    check.exact_measured = measured(own) - measured(all_top);
  }
  state.validation->joint_decisions.push_back(std::move(check));
  state.answer_evaluations += static_cast<int64_t>(memo.size());
  state.validation->seconds += seconds_since(start);
}

void summarise_validation(const RunInputs& in, MeasureValidation& validation) {
  std::vector<double> predicted, measured;
  for (const auto& p : validation.pairs) {
    predicted.push_back(p.predicted);
    measured.push_back(p.measured);
  }
  validation.spearman = spearman(predicted, measured);
  spdlog::info("{} against the exact {}: Spearman {:.3f} over {} (head, level) pairs",
               distortion_measure_name(in.options.measure), in.measured_label(),
               validation.spearman, validation.pairs.size());
  for (const auto& j : validation.joint_decisions) {
    spdlog::info("layer {} decision [{}]: predicted added {} {:.4g}, measured {:.4g}{}", j.layer_id,
                 window_labels(j.windows), in.measured_label(), j.predicted, j.measured,
                 j.exact_windows.empty()
                     ? std::string()
                     : fmt::format("; the exact measure's own decision [{}]: {:.4g}",
                                   window_labels(j.exact_windows), j.exact_measured));
  }
}

}  // namespace headwise::calib::seqcalib
