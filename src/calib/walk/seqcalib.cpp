// SeqCalib's entry point and the order of its passes: the measure (measures/, one file each),
// the probe (seqcalib_probe.cpp, or a resume checkpoint), the walk (seqcalib_walk.cpp, each global
// layer decided by the measure through seqcalib_decide.cpp), the completion and the re-walks the
// measure asks for (seqcalib_completion.cpp), and the validation summary (seqcalib_validation.cpp).
// The state the passes share is seqcalib_run.hpp.
#include "headwise/calib/seqcalib.hpp"

#include <spdlog/spdlog.h>

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "calib/measures/measure.hpp"
#include "calib/walk/seqcalib_completion.hpp"
#include "calib/walk/seqcalib_curves.hpp"
#include "calib/walk/seqcalib_decide.hpp"
#include "calib/walk/seqcalib_run.hpp"
#include "calib/walk/seqcalib_validation.hpp"
#include "calib/walk/seqcalib_walk.hpp"
#include "headwise/arch/attention.hpp"
#include "headwise/calib/measure_traits.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/resources.hpp"
#include "headwise/core/window.hpp"

namespace headwise::calib {
namespace seqcalib {

RunInputs::RunInputs(arch::DecoderModel& model, const std::vector<std::vector<int64_t>>& sequences,
                     const SeqCalibOptions& options)
    : model(model),
      spec(model.spec()),
      sequences(sequences),
      options(options),
      world(options.collective != nullptr ? *options.collective : dist::single_process()) {}

void RunInputs::validate() const {
  if (sequences.empty()) throw_input_error("calibration: no sequences");
  if (options.micro_batch <= 0) throw_field_error("micro_batch", " must be positive");
  if (!options.head_bytes) throw Error("calibration: no byte model");
  if (spec.global_layer_ids().empty()) {
    throw_input_error("{}: the model has no global attention layers: nothing to calibrate",
                      spec.model_type);
  }
}

void RunInputs::take_shard() {
  local_index = dist::shard_sequences(sequences.size(), options.micro_batch, world.rank(),
                                      world.world_size());
  for (size_t i : local_index) {
    local_sequences.push_back(sequences[i]);
    if (i < options.answer_positions.size()) local_answers.push_back(options.answer_positions[i]);
  }
  if (world.world_size() > 1) {
    spdlog::info("rank {} of {}: {} of the {} sequences", world.rank(), world.world_size(),
                 local_index.size(), sequences.size());
  }
}

std::vector<std::vector<int64_t>> RunInputs::local_prefix(int64_t samples) const {
  const auto count = std::count_if(local_index.begin(), local_index.end(), [samples](size_t i) {
    return static_cast<int64_t>(i) < samples;
  });
  return {local_sequences.begin(), local_sequences.begin() + count};
}

measure::DistortionAccumulator RunInputs::merged_over_ranks(
    int64_t layer_id, const measure::DistortionAccumulator& local) const {
  if (world.world_size() == 1) return local;
  measure::DistortionAccumulator total(local.num_kv_heads(), local.num_levels());
  for (const auto& bytes :
       world.all_gather(local.to_bytes(), fmt::format("layer {}: block-mse sums", layer_id))) {
    total.merge(measure::DistortionAccumulator::from_bytes(bytes));
  }
  return total;
}

const char* RunInputs::measured_label() const {
  return divergence_label(measure_traits(options.measure).divergence);
}

std::vector<int64_t> RunInputs::windows_of(const std::vector<size_t>& levels) const {
  std::vector<int64_t> w;
  for (size_t l : levels) w.push_back(options.ladder.levels[l]);
  return w;
}

std::string RunInputs::labels_of(const std::vector<size_t>& levels) const {
  return window_labels(windows_of(levels));
}

namespace {

// The result, assembled once from what the run ended with: the completed policy, the walk's
// decisions and record, the probe, the passes tried, and what the run cost.
SeqCalibResult assemble(const RunInputs& in, RunState state, Clock::time_point start) {
  SeqCalibResult r;
  Completion& policy = state.completion;
  r.windows = std::move(policy.windows);
  r.expected_distortion = std::move(policy.expected_distortion);
  r.global_bytes = policy.global_bytes;
  r.global_bytes_before_completion = policy.bytes_before;
  r.total_distortion = policy.total_distortion;
  r.completion_proven_optimal = policy.proven_optimal;
  r.divergence_policy = policy.divergence;
  r.windows_moved_by_completion = policy.windows_moved;
  r.curves = to_curves(state.decisions.groups);
  for (const auto& [layer, noise] : state.decisions.noise) r.decision_noise.push_back(noise);
  for (const auto& [layer, groups] : state.probe_groups) append(r.probe_curves, to_curves(groups));
  r.probe_lambda = state.probe_lambda;
  r.probe_seconds = state.probe_seconds;
  r.layers = std::move(state.walk.layers);
  r.divergence_walk = state.walk.divergence;
  r.activations = std::move(state.walk.activations);
  Refinements& passes = state.refinements;
  r.rewalks = passes.rewalks;
  r.divergence_by_pass = std::move(passes.divergence_by_pass);
  r.resolves = passes.resolves;
  r.divergence_by_resolve = std::move(passes.divergence_by_resolve);
  r.span_by_resolve = std::move(passes.span_by_resolve);
  r.answer_evaluations = state.answer_evaluations;
  r.validation = std::move(state.validation);
  if (r.validation) summarise_validation(in, *r.validation);
  r.total_seconds = seconds_since(start);
  r.local_sequences = static_cast<int64_t>(in.local_sequences.size());
  r.exchanged_bytes = in.world.bytes_sent();
  r.peak_rss_bytes = peak_rss_bytes();
  r.peak_device_bytes = peak_device_bytes(in.model.device());
  return r;
}

// The whole run: the measure's preparation, the probe (or a resume checkpoint), the conditioned
// walk, the exact completion and what the measure does after it.
SeqCalibResult run(arch::DecoderModel& model, const std::vector<std::vector<int64_t>>& sequences,
                   const SeqCalibOptions& options) {
  const auto start = Clock::now();
  RunInputs in(model, sequences, options);
  RunState state;
  reset_peak_device_bytes(model.device());
  in.validate();
  in.take_shard();
  const std::unique_ptr<Measure> measure = make_measure(in, state);
  if (options.resume) {
    restore(*options.resume, state);
  } else {
    probe(in, *measure, state);
  }
  if (!options.conditioned) plan_unconditioned(in, state);
  adopt(state, walk(in, *measure, state, WalkPass::kFirst));
  complete(in, state);
  measure->refine_after_completion(in, state);
  return assemble(in, std::move(state), start);
}

}  // namespace
}  // namespace seqcalib

at::Tensor PolicyAttentionCore::attend(const arch::AttentionInputs& in) {
  if (in.sliding_window > 0) return arch::windowed_attention(in, in.sliding_window, 0, chunk_);
  const auto it = windows_.find(in.layer_id);
  HEADWISE_CHECK(it != windows_.end(), "no windows for global layer {}", in.layer_id);
  return arch::windowed_attention(in, it->second, sink_tokens_, chunk_);
}

int64_t default_probe_samples(int64_t sequences) {
  return (sequences + 1) / 2;
}

int64_t effective_probe_samples(int64_t requested, int64_t sequences) {
  if (requested < 0)
    throw_field_error("probe_samples", " must not be negative (got {})", requested);
  return requested > 0 ? std::min(requested, sequences) : default_probe_samples(sequences);
}

SeqCalibResult run_seqcalib(arch::DecoderModel& model,
                            const std::vector<std::vector<int64_t>>& sequences,
                            const SeqCalibOptions& options) {
  // answer-grad back-propagates through the layers above: no inference tensors then. Everything
  // else runs without a graph (the measure opens one where it needs it).
  const c10::InferenceMode inference(!measure_traits(options.measure).needs_gradients);
  const at::NoGradGuard no_grad;
  return seqcalib::run(model, sequences, options);
}

}  // namespace headwise::calib
