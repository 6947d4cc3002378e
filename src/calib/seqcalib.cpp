#include "headwise/calib/seqcalib.hpp"

#include <spdlog/spdlog.h>

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "headwise/arch/attention.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/answer_grad.hpp"
#include "headwise/calib/answer_span.hpp"
#include "headwise/calib/walk_state.hpp"
#include "finite_checks.hpp"
#include "joint_descent.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/progress.hpp"
#include "headwise/core/resources.hpp"
#include "headwise/core/units.hpp"
#include "headwise/measure/multiwindow.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::calib {
namespace {

using Clock = std::chrono::steady_clock;
using Windows = std::map<int64_t, std::vector<int64_t>>;
using Accumulators = std::map<int64_t, measure::DistortionAccumulator>;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Measures every global layer it sees; with `decide` set (single micro-batch), it also
// decides the layer's windows right away and returns the windowed output, saving a second
// pass through the layer.
class MeasuringCore final : public arch::AttentionCore {
 public:
  using DecideFn = std::function<std::vector<int64_t>(int64_t layer_id)>;
  MeasuringCore(const SeqCalibOptions& options, int64_t chunk, Accumulators& accumulators, DecideFn decide)
      : options_(options), chunk_(chunk), accumulators_(accumulators), decide_(std::move(decide)) {}

  at::Tensor attend(const arch::AttentionInputs& in) override {
    if (in.sliding_window > 0) return arch::windowed_attention(in, in.sliding_window, 0, chunk_);
    check_heads_finite(in);
    auto [it, inserted] = accumulators_.try_emplace(in.layer_id, in.k.size(1), static_cast<int64_t>(options_.ladder.size()));
    at::Tensor full = measure::measure_window_distortion(in, options_.ladder, options_.sink_tokens, chunk_, it->second);
    if (!decide_) return full;
    return arch::windowed_attention(in, decide_(in.layer_id), options_.sink_tokens, chunk_);
  }

 private:
  const SeqCalibOptions& options_;
  int64_t chunk_;
  Accumulators& accumulators_;
  DecideFn decide_;
};

std::vector<solve::Group> layer_groups(const arch::LayerSpec& layer, const measure::DistortionAccumulator& acc,
                                       const SeqCalibOptions& options) {
  std::vector<solve::Group> groups;
  for (int64_t h = 0; h < layer.attention->num_kv_heads; ++h) {
    solve::Group group{layer.id, h, {}};
    for (size_t l = 0; l < options.ladder.size(); ++l) {
      const int64_t window = options.ladder.levels[l];
      group.options.push_back({window, options.head_bytes(layer, window), acc.distortion(h, static_cast<int64_t>(l))});
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

MeasureCheck measure_check(int64_t layer, int64_t head, std::vector<int64_t> windows, double predicted, double measured) {
  MeasureCheck c;
  c.layer_id = layer;
  c.kv_head = head;
  c.windows = std::move(windows);
  c.predicted = predicted;
  c.measured = measured;
  return c;
}

template <typename T>
void append(std::vector<T>& to, const std::vector<T>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

// The whole run: probe pass, then the conditioned walk.
class SeqCalibRun {
 public:
  SeqCalibRun(arch::DecoderModel& model, const std::vector<std::vector<int64_t>>& sequences, const SeqCalibOptions& options)
      : model_(model),
        spec_(model.spec()),
        sequences_(sequences),
        options_(options),
        world_(options.collective != nullptr ? *options.collective : dist::single_process()) {}

  SeqCalibResult run() {
    const auto start = Clock::now();
    reset_peak_device_bytes(model_.device());
    validate();
    take_shard();
    if (answer_aware()) prepare_answer_measures();
    if (options_.resume) {
      restore(*options_.resume);
    } else {
      probe();
    }
    if (!options_.conditioned) plan_unconditioned();
    walk();
    complete();
    if (span()) {
      // Verified end to end by the walks' own final streams (no extra forward): one re-solve at most.
      if (options_.conditioned) resolve_across_layers_by_walks();
    } else if (answer_aware()) {
      measure_completion_effect();
      if (options_.conditioned) {
        rewalk_while_completion_moves_lower_layers();
        resolve_across_layers();
      }
    }
    if (result_.validation) summarise_validation();
    result_.total_seconds = seconds_since(start);
    result_.local_sequences = static_cast<int64_t>(local_sequences_.size());
    result_.exchanged_bytes = world_.bytes_sent();
    result_.peak_rss_bytes = peak_rss_bytes();
    result_.peak_device_bytes = peak_device_bytes(model_.device());
    return std::move(result_);
  }

 private:
  void validate() const {
    if (sequences_.empty()) throw_input_error("calibration: no sequences");
    if (options_.micro_batch <= 0) throw_input_error("--micro-batch must be positive");
    if (!options_.head_bytes) throw Error("calibration: no byte model");
    if (spec_.global_layer_ids().empty()) {
      throw_input_error("{}: the model has no global attention layers: nothing to calibrate", spec_.model_type);
    }
  }

  // This rank's micro-batches (all of them in one process), and their answer positions.
  void take_shard() {
    local_index_ = dist::shard_sequences(sequences_.size(), options_.micro_batch, world_.rank(), world_.world_size());
    for (size_t i : local_index_) {
      local_sequences_.push_back(sequences_[i]);
      if (i < options_.answer_positions.size()) local_answers_.push_back(options_.answer_positions[i]);
    }
    if (world_.world_size() > 1) {
      spdlog::info("rank {} of {}: {} of the {} sequences", world_.rank(), world_.world_size(), local_index_.size(),
                   sequences_.size());
    }
  }

  // The shard's sequences among the first `samples` (a prefix of the shard: shards are in order).
  std::vector<std::vector<int64_t>> local_prefix(int64_t samples) const {
    const auto count = std::count_if(local_index_.begin(), local_index_.end(),
                                     [samples](size_t i) { return static_cast<int64_t>(i) < samples; });
    return {local_sequences_.begin(), local_sequences_.begin() + count};
  }

  // Every rank's sums for one layer, merged (exactly: the result does not depend on the split).
  measure::DistortionAccumulator merged_over_ranks(int64_t layer_id, const measure::DistortionAccumulator& local) const {
    if (world_.world_size() == 1) return local;
    measure::DistortionAccumulator total(local.num_kv_heads(), local.num_levels());
    for (const auto& bytes : world_.all_gather(local.to_bytes(), fmt::format("layer {}: block-mse sums", layer_id))) {
      total.merge(measure::DistortionAccumulator::from_bytes(bytes));
    }
    return total;
  }

  bool answer_aware() const { return calib::answer_aware(options_.measure); }
  bool gradient_measure() const { return options_.measure == DistortionMeasure::kAnswerGrad; }
  bool span() const { return span_measure(options_.measure); }

  // The reference forward of the answer measure, and for validation the exact measure beside it.
  void prepare_answer_measures() {
    if (span()) {
      span_ = options_.span;
      if (span_ == nullptr) {
        AnswerSpanOptions so;
        so.micro_batch = options_.micro_batch;
        so.sink_tokens = options_.sink_tokens;
        so.windows = options_.ladder.levels;
        so.divergence = answer_divergence(options_.measure);
        own_span_ = std::make_unique<AnswerSpan>(model_, local_sequences_, local_answers_, so, world_);
        span_ = own_span_.get();
      }
      if (!options_.validate_measure) return;
      result_.validation.emplace();
    }
    spdlog::info("{}: full-KV reference at the answer positions ({} sequences)",
                 span() ? "validation (exact measure)" : distortion_measure_name(options_.measure), local_sequences_.size());
    answer_kl_ = std::make_unique<AnswerKl>(model_, local_sequences_, local_answers_, options_.micro_batch,
                                            options_.sink_tokens, world_, answer_divergence(options_.measure));
    if (gradient_measure()) {
      sensitivity_ = std::make_unique<AnswerSensitivity>(model_, *answer_kl_, options_.ladder.levels, options_.sink_tokens);
    }
    if (gradient_measure() && options_.validate_measure) result_.validation.emplace();
  }

  // The answer-span measure of layer `site.layer`'s joint windows, memoised in `memo`; its
  // prefetch measures every assignment a step names in one batch.
  struct LayerMeasure {
    std::function<double(const std::vector<size_t>&)> measure;
    JointPrefetch prefetch;
  };
  LayerMeasure span_layer_measure(const SpanSite& site, std::map<std::vector<size_t>, double>& memo) {
    const auto run = [this, &site, &memo](const std::vector<std::vector<size_t>>& assignments) {
      std::vector<std::vector<size_t>> missing;
      std::vector<SpanOutputs> outputs;
      for (const auto& levels : assignments) {
        if (memo.contains(levels) || std::find(missing.begin(), missing.end(), levels) != missing.end()) continue;
        missing.push_back(levels);
        outputs.push_back(site.compose(windows_of(levels)));
      }
      if (missing.empty()) return;
      const auto values = span_->evaluate(site, outputs, fmt::format("layer {}: {}", site.layer, measured_label()));
      for (size_t c = 0; c < missing.size(); ++c) memo.emplace(missing[c], values[c]);
    };
    return {[run, &memo](const std::vector<size_t>& levels) {
              if (!memo.contains(levels)) run({levels});
              return memo.at(levels);
            },
            run};
  }
  // What the answer measures average, as the logs name it.
  const char* measured_label() const { return divergence_label(answer_divergence(options_.measure)); }

  void summarise_validation() {
    auto& v = *result_.validation;
    std::vector<double> predicted, measured;
    for (const auto& p : v.pairs) {
      predicted.push_back(p.predicted);
      measured.push_back(p.measured);
    }
    v.spearman = spearman(predicted, measured);
    spdlog::info("{} against the exact {}: Spearman {:.3f} over {} (head, level) pairs",
                 distortion_measure_name(options_.measure), measured_label(), v.spearman, v.pairs.size());
    for (const auto& j : v.joint_decisions) {
      spdlog::info("layer {} decision [{}]: predicted added {} {:.4g}, measured {:.4g}{}", j.layer_id,
                   window_labels(j.windows), measured_label(), j.predicted, j.measured,
                   j.exact_windows.empty() ? std::string()
                                           : fmt::format("; the exact measure's own decision [{}]: {:.4g}",
                                                         window_labels(j.exact_windows), j.exact_measured));
    }
  }

  // The layer's joint windows → added answer KL: predicted (answer-grad, prepared on `stream`
  // here) or measured (answer-kl, memoised in `memo`).
  std::function<double(const std::vector<size_t>&)> layer_measure(AnswerKl& exact, AnswerSensitivity* sensitivity,
                                                                   int64_t layer_id, ActivationStream& stream,
                                                                   std::map<std::vector<size_t>, double>& memo) const {
    if (sensitivity == nullptr) return joint_measure(exact, layer_id, stream, memo);
    sensitivity->prepare(layer_id, stream);
    return [sensitivity](const std::vector<size_t>& levels) { return sensitivity->predict(levels); };
  }

  // Validation: the probe's predicted (head, level) pairs against the exact measure.
  void validate_probe_pairs(AnswerKl& exact, int64_t layer_id, ActivationStream& stream,
                            const std::vector<solve::Group>& predicted) {
    const auto start = Clock::now();
    const std::vector<solve::Group> measured = answer_probe_groups(exact, nullptr, layer_id, stream);
    const size_t top = options_.ladder.size() - 1;
    for (size_t h = 0; h < predicted.size(); ++h) {
      for (size_t l = 0; l < top; ++l) {
        const int64_t window = options_.ladder.levels[l];
        result_.validation->pairs.push_back(measure_check(layer_id, static_cast<int64_t>(h), {window},
                                                          predicted[h].options[l].distortion,
                                                          measured[h].options[l].distortion));
      }
    }
    result_.validation->seconds += seconds_since(start);
  }

  // Validation: the chosen joint windows' predicted added KL against the measured one; for the span
  // measure also the exact measure's own decision on the same stream (the same descent, allowance
  // and price), and what it costs by the exact measure.
  void validate_joint_decision(int64_t layer_id, ActivationStream& stream, const std::vector<size_t>& assign,
                               const std::function<double(const std::vector<size_t>&)>& predicted,
                               const std::vector<solve::Group>& groups, int64_t allowance, double price) {
    const auto start = Clock::now();
    std::map<std::vector<size_t>, double> memo;
    const auto exact = joint_measure(*answer_kl_, layer_id, stream, memo);
    const std::vector<size_t> all_top(assign.size(), options_.ladder.size() - 1);
    MeasureCheck check =
        measure_check(layer_id, -1, windows_of(assign), predicted(assign) - predicted(all_top), exact(assign) - exact(all_top));
    if (span() && options_.joint_heads) {
      const std::vector<size_t> own = greedy_joint_descent(groups, allowance, with_extrapolated_levels(exact, groups), price);
      check.exact_windows = windows_of(own);
      check.exact_measured = exact(own) - exact(all_top);
    }
    result_.validation->joint_decisions.push_back(std::move(check));
    result_.answer_kl_evaluations += static_cast<int64_t>(memo.size());
    result_.validation->seconds += seconds_since(start);
  }

  // The windows of one layer for a ladder-level index per head.
  std::vector<int64_t> windows_of(const std::vector<size_t>& levels) const {
    std::vector<int64_t> w;
    for (size_t l : levels) w.push_back(options_.ladder.levels[l]);
    return w;
  }
  // The same as a log shows it ("full", not the sentinel).
  std::string labels_of(const std::vector<size_t>& levels) const { return window_labels(windows_of(levels)); }

  // Every head's curve against the other heads at `at`: d(h, l) = E(at, head h at l) -
  // E(at, head h at the top level), E the measured answer KL of the layer's joint windows.
  std::vector<solve::Group> marginal_groups(int64_t layer_id, const std::vector<size_t>& at,
                                            const std::function<double(const std::vector<size_t>&)>& joint,
                                            const JointPrefetch& prefetch = {}) const {
    const auto& layer = spec_.layer(layer_id);
    const size_t top = options_.ladder.size() - 1;
    if (prefetch) prefetch(marginal_assignments(at));
    std::vector<solve::Group> groups;
    for (size_t h = 0; h < at.size(); ++h) {
      std::vector<size_t> probe = at;
      probe[h] = top;
      const double base = joint(probe);
      solve::Group group{layer_id, static_cast<int64_t>(h), {}};
      for (size_t l = 0; l <= top; ++l) {
        probe[h] = l;
        const int64_t window = options_.ladder.levels[l];
        // Below 0 is measurement noise (a cut that "helps"); the solver needs d >= 0.
        group.options.push_back({window, options_.head_bytes(layer, window), std::max(0.0, joint(probe) - base)});
      }
      groups.push_back(std::move(group));
    }
    extrapolate_curves(groups, options_.unmeasured_levels, options_.extrapolation);
    return groups;
  }

  // Every joint assignment of a layer of `heads` KV heads when there are at most
  // kEnumeratedAssignments of them (the descent then prices from one batch); else none.
  static constexpr size_t kEnumeratedAssignments = 64;
  std::vector<std::vector<size_t>> every_assignment(size_t heads) const {
    const size_t levels = options_.ladder.size();
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

  // Every assignment marginal_groups(at) prices: each head at each level, the others at `at`.
  std::vector<std::vector<size_t>> marginal_assignments(const std::vector<size_t>& at) const {
    std::vector<std::vector<size_t>> all;
    for (size_t h = 0; h < at.size(); ++h) {
      for (size_t l = 0; l < options_.ladder.size(); ++l) {
        all.push_back(at);
        all.back()[h] = l;
      }
    }
    return all;
  }

  // A memoised measure of one layer's joint windows on the stream entering it.
  std::function<double(const std::vector<size_t>&)> joint_measure(AnswerKl& measure, int64_t layer_id,
                                                                  ActivationStream& stream,
                                                                  std::map<std::vector<size_t>, double>& memo) const {
    return [this, &measure, layer_id, &stream, &memo](const std::vector<size_t>& levels) {
      const auto it = memo.find(levels);
      if (it != memo.end()) return it->second;
      const double e = measure.evaluate(layer_id, stream, windows_of(levels));
      if (!std::isfinite(e)) {
        throw NumericError(fmt::format("layer {}: {} is NaN/Inf at windows [{}]: check the layer's weights", layer_id,
                                       divergence_label(measure.divergence()), labels_of(levels)));
      }
      memo.emplace(levels, e);
      return e;
    };
  }

  std::vector<solve::Group> answer_probe_groups(AnswerKl& measure, AnswerSensitivity* sensitivity, int64_t layer_id,
                                               ActivationStream& stream) const {
    std::map<std::vector<size_t>, double> memo;
    const auto heads = static_cast<size_t>(spec_.layer(layer_id).attention->num_kv_heads);
    return marginal_groups(layer_id, std::vector<size_t>(heads, options_.ladder.size() - 1),
                           layer_measure(measure, sensitivity, layer_id, stream, memo));
  }

  // Unconditioned curves: every global layer measured with full KV below.
  void probe() {
    const auto start = Clock::now();
    const int64_t samples = span() ? static_cast<int64_t>(sequences_.size())
                                   : effective_probe_samples(options_.probe_samples, static_cast<int64_t>(sequences_.size()));
    if (span()) {
      span_probe();
    } else {
      const std::vector<std::vector<int64_t>> probe_sequences = local_prefix(samples);
      ActivationStream stream(model_, probe_sequences, options_.micro_batch, options_.activations);
      if (answer_aware()) {
        answer_probe(stream, probe_sequences);
      } else {
        block_mse_probe(stream);
      }
    }
    std::vector<solve::Group> all;
    for (const auto& [id, groups] : probe_groups_) append(all, groups);
    result_.probe_lambda = solve::min_fitting_lambda(all, options_.global_budget_bytes);
    result_.probe_seconds = seconds_since(start);
    spdlog::info("probe: {} global layers measured on {} sequences in {:.1f}s, lambda {:.4g}", probe_groups_.size(),
                 samples, result_.probe_seconds, result_.probe_lambda);
  }

  // The answer-span probe: every global layer's curves on the full-KV stream (the reference pass's
  // sites), every (head, level) of every layer in one sweep over the layers. Every sequence serves:
  // the probe costs no forward here.
  void span_probe() {
    std::vector<int64_t> layers = spec_.global_layer_ids();
    std::vector<AnswerSpan::SweepItem> items;
    std::vector<std::vector<std::vector<size_t>>> assignments;
    for (int64_t id : layers) {
      const auto heads = static_cast<size_t>(spec_.layer(id).attention->num_kv_heads);
      const std::vector<size_t> top(heads, options_.ladder.size() - 1);
      std::vector<std::vector<size_t>> wanted = marginal_assignments(top);
      // Nothing below the lowest global layer is cut: the walk measures it on this very stream, so
      // the sweep measures every assignment the walk may ask for (when there are few) once.
      if (id == layers.front()) append(wanted, every_assignment(heads));
      // Every head at full KV on the full-KV stream is the reference itself: divergence 0, no run.
      wanted.erase(std::remove(wanted.begin(), wanted.end(), top), wanted.end());
      assignments.push_back(unique_assignments(std::move(wanted)));
      const SpanSite& site = span_->reference_site(id);
      AnswerSpan::SweepItem item{&site, {}};
      for (const auto& levels : assignments.back()) item.candidates.push_back(site.compose(windows_of(levels)));
      items.push_back(std::move(item));
    }
    const auto values = span_->sweep(items, fmt::format("probe (full KV): {}", measured_label()));
    model_.release_all();
    for (size_t i = 0; i < layers.size(); ++i) {
      std::map<std::vector<size_t>, double>& memo = probe_memo_[layers[i]];
      for (size_t c = 0; c < assignments[i].size(); ++c) memo.emplace(assignments[i][c], values[i][c]);
      const auto heads = static_cast<size_t>(spec_.layer(layers[i]).attention->num_kv_heads);
      const std::vector<size_t> top(heads, options_.ladder.size() - 1);
      memo.emplace(top, 0.0);
      probe_groups_[layers[i]] = marginal_groups(layers[i], top, [&memo](const std::vector<size_t>& l) { return memo.at(l); });
      append(result_.probe_curves, to_curves(probe_groups_[layers[i]]));
    }
    result_.answer_kl_evaluations += span_->evaluations();
    if (result_.validation) validate_span_probe();
  }

  static std::vector<std::vector<size_t>> unique_assignments(std::vector<std::vector<size_t>> all) {
    std::vector<std::vector<size_t>> out;
    for (auto& a : all) {
      if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(std::move(a));
    }
    return out;
  }

  // Validation: every probe (head, finite level) pair of the span measure against the exact measure,
  // on a full-KV walk of the same sequences.
  void validate_span_probe() {
    const auto start = Clock::now();
    ActivationStream stream(model_, local_sequences_, options_.micro_batch, options_.activations);
    arch::ExactAttentionCore exact(model_.attention_chunk());
    const size_t top = options_.ladder.size() - 1;
    for (int64_t i = 0; i < spec_.num_layers(); ++i) {
      if (spec_.layer(i).is_global()) {
        const std::vector<solve::Group> measured = answer_probe_groups(*answer_kl_, nullptr, i, stream);
        const std::vector<solve::Group>& predicted = probe_groups_.at(i);
        for (size_t h = 0; h < predicted.size(); ++h) {
          for (size_t l = 0; l < top; ++l) {
            result_.validation->pairs.push_back(measure_check(i, static_cast<int64_t>(h), {options_.ladder.levels[l]},
                                                              predicted[h].options[l].distortion,
                                                              measured[h].options[l].distortion));
          }
        }
      }
      stream.apply([&](const at::Tensor& h) { return model_.run_layer(i, h, {&exact, nullptr, 0}); });
      model_.release_layer(i);
    }
    result_.validation->seconds += seconds_since(start);
  }

  void answer_probe(ActivationStream& stream, const std::vector<std::vector<int64_t>>& probe_sequences) {
    AnswerKl measure = answer_kl_->prefix(static_cast<int64_t>(probe_sequences.size()));
    std::optional<AnswerSensitivity> sensitivity;
    if (gradient_measure()) sensitivity.emplace(model_, measure, options_.ladder.levels, options_.sink_tokens);
    arch::ExactAttentionCore exact(model_.attention_chunk());
    Progress progress(fmt::format("probe (full KV, {})", distortion_measure_name(options_.measure)),
                      spec_.num_layers());
    for (int64_t i = 0; i < spec_.num_layers(); ++i) {
      if (spec_.layer(i).is_global()) {
        probe_groups_[i] = answer_probe_groups(measure, sensitivity ? &*sensitivity : nullptr, i, stream);
        if (result_.validation) validate_probe_pairs(measure, i, stream, probe_groups_[i]);
        append(result_.probe_curves, to_curves(probe_groups_[i]));
      }
      stream.apply([&](const at::Tensor& h) {
        return checked_finite(model_.run_layer(i, h, {&exact, nullptr, 0}), i, spec_.layer(i).kind);
      });
      model_.release_layer(i);
      progress.update(i + 1, fmt::format("layer {} {}", i, layer_kind_name(spec_.layer(i).kind)));
    }
    progress.finish();
    result_.answer_kl_evaluations += measure.evaluations();
  }

  void block_mse_probe(ActivationStream& stream) {
    Accumulators accumulators;
    MeasuringCore core(options_, model_.attention_chunk(), accumulators, nullptr);
    Progress progress("probe (full KV)", spec_.num_layers());
    for (int64_t i = 0; i < spec_.num_layers(); ++i) {
      model_.prefetch_layer(i + 1);  // loads while layer i computes
      stream.apply([&](const at::Tensor& h) {
        at::Tensor out = model_.run_layer(i, h, {&core, nullptr, 0});
        // A global layer's NaN is reported by head (its distortions) before the hidden check.
        if (const auto it = accumulators.find(i); it != accumulators.end()) it->second.check_finite(i);
        return checked_finite(std::move(out), i, spec_.layer(i).kind);
      });
      model_.release_layer(i);
      progress.update(i + 1, fmt::format("layer {} {}", i, layer_kind_name(spec_.layer(i).kind)));
    }
    progress.finish();
    for (const int64_t layer_id : spec_.global_layer_ids()) {
      // A rank without probe sequences measured nothing: it contributes empty sums.
      const auto [local, inserted] = accumulators.try_emplace(
          layer_id, spec_.layer(layer_id).attention->num_kv_heads, static_cast<int64_t>(options_.ladder.size()));
      const measure::DistortionAccumulator acc = merged_over_ranks(layer_id, local->second);
      acc.check_finite(layer_id);
      probe_groups_[layer_id] = layer_groups(spec_.layer(layer_id), acc, options_);
      append(result_.probe_curves, to_curves(probe_groups_[layer_id]));
    }
  }

  // Resume: the probe and the decisions up to state.last_layer come from the checkpoint.
  void restore(const WalkState& state) {
    probe_groups_ = state.probe_groups;
    for (const auto& [layer_id, groups] : probe_groups_) append(result_.probe_curves, to_curves(groups));
    result_.probe_lambda = state.probe_lambda;
    result_.probe_seconds = state.probe_seconds;
    result_.windows = state.windows;
    result_.layers = state.layers;
    result_.curves = to_curves(state.decided_groups);
    decided_groups_ = state.decided_groups;
    decided_choice_ = state.decided_choice;
    spent_ = state.spent;
    replay_until_ = state.last_layer;
    spdlog::info("resuming after layer {}: {} global layers decided, {} spent", state.last_layer, state.windows.size(),
                 format_bytes(spent_));
  }

  WalkState state_after(int64_t layer_id) const {
    return {layer_id, probe_groups_, result_.probe_lambda, result_.probe_seconds, result_.windows, decided_groups_,
            decided_choice_, spent_, result_.layers};
  }

  // The ablation baseline: one exact solve over curves measured with full KV below.
  void plan_unconditioned() {
    std::vector<solve::Group> all;
    for (const auto& [id, groups] : probe_groups_) append(all, groups);
    const auto solution = solve::solve_exact(all, options_.global_budget_bytes);
    for (size_t g = 0; g < all.size(); ++g) {
      unconditioned_plan_[all[g].layer_id].push_back(solution.choice[g]);
    }
  }

  std::vector<solve::Group> future_probe_groups(int64_t layer_id) const {
    std::vector<solve::Group> future;
    for (auto it = probe_groups_.upper_bound(layer_id); it != probe_groups_.end(); ++it) append(future, it->second);
    return future;
  }

  // Chooses layer `layer_id`'s windows from its curves: argmin d + lambda*r with the smallest
  // lambda at which this layer plus the probe plan of the layers above fits what is left.
  std::vector<int64_t> decide(int64_t layer_id, const measure::DistortionAccumulator& local, LayerReport& report) {
    const measure::DistortionAccumulator acc = merged_over_ranks(layer_id, local);
    acc.check_finite(layer_id);
    if (!options_.conditioned) return record_decision(probe_groups_.at(layer_id), unconditioned_plan_.at(layer_id), report);
    const std::vector<solve::Group> groups = layer_groups(spec_.layer(layer_id), acc, options_);
    price_layer(layer_id, groups, report);
    return record_decision(groups, solve::relax_at(groups, report.lambda).choice, report);
  }

  // The controller: the smallest lambda at which this layer's curves plus the probe plan of the
  // layers above fit what is left of the budget (report.lambda), the bytes that plan keeps for
  // the layers above (report.planned_ahead); returns what this layer may spend.
  int64_t price_layer(int64_t layer_id, const std::vector<solve::Group>& groups, LayerReport& report) const {
    const std::vector<solve::Group> future = future_probe_groups(layer_id);
    const int64_t remaining = options_.global_budget_bytes - spent_;
    std::vector<solve::Group> combined = groups;
    append(combined, future);
    report.lambda = solve::min_fitting_lambda(combined, remaining);
    report.planned_ahead = future.empty() ? 0 : solve::relax_at(future, report.lambda).total_bytes;
    return remaining - report.planned_ahead;
  }

  void walk() {
    ActivationStream stream(model_, local_sequences_, options_.micro_batch, options_.activations);
    result_.activations = stream.placement_name();
    PolicyAttentionCore policy_core(result_.windows, options_.sink_tokens, model_.attention_chunk());
    Progress progress(options_.conditioned ? "SeqCalib" : "calibrate (unconditioned)", spec_.num_layers());
    const int64_t resume_at = restore_stream_checkpoint(stream);
    for (int64_t i = resume_at; i < spec_.num_layers(); ++i) {
      if (spec_.layer(i).is_global() && i > replay_until_) keep_stream_checkpoint(i, stream);
      if (i <= replay_until_) {  // decided before the interruption: recompute the stream only
        stream.apply([&](const at::Tensor& h) { return model_.run_layer(i, h, {&policy_core, nullptr, 0}); });
        model_.release_layer(i);
        progress.update(i + 1, fmt::format("layer {} replayed", i));
        continue;
      }
      const auto start = Clock::now();
      const int64_t sent_before = world_.bytes_sent();
      model_.prefetch_layer(i + 1);  // loads while layer i computes
      LayerReport report{i, std::string(layer_kind_name(spec_.layer(i).kind))};
      if (spec_.layer(i).is_global()) {
        run_global_layer(i, stream, policy_core, report);
      } else {
        stream.apply([&](const at::Tensor& h) {
          return checked_finite(model_.run_layer(i, h, {&policy_core, nullptr, 0}), i, spec_.layer(i).kind);
        });
      }
      model_.release_layer(i);
      report.seconds = seconds_since(start);
      report.exchanged_bytes = world_.bytes_sent() - sent_before;
      result_.layers.push_back(report);
      progress.update(i + 1, spec_.layer(i).is_global()
                                 ? fmt::format("layer {} global: {} spent, lambda {:.3g}", i,
                                               format_bytes(spent_), report.lambda)
                                 : fmt::format("layer {} {}", i, report.kind));
      // A re-walk is not checkpointed: a resumed run redoes it from the first walk's state.
      if (spec_.layer(i).is_global() && options_.checkpoint && !rewalking_) options_.checkpoint(state_after(i));
    }
    progress.finish();
    // The stream has passed every layer under the walk's windows: its end-to-end answer KL costs
    // no further run.
    if (span()) {
      result_.answer_kl_walk = span_->evaluate_final(stream);
    } else if (answer_aware()) {
      result_.answer_kl_walk = answer_kl_->evaluate_final(stream);
    }
  }

  // The walk's stream entering a global layer, with the windows of the global layers below it as the
  // walk ran them: a re-walk that replays the same windows below starts there instead of at the
  // embeddings. Kept while they fit kStreamCheckpointLimitBytes (the same tensors a replay would compute).
  struct StreamCheckpoint {
    Windows below;
    std::vector<at::Tensor> hidden;
  };

  void keep_stream_checkpoint(int64_t layer, const ActivationStream& stream) {
    if (stream_checkpoints_.contains(layer) || stream_checkpoint_bytes_ + stream.bytes() > kStreamCheckpointLimitBytes) return;
    StreamCheckpoint c;
    for (const auto& [id, w] : result_.windows) {
      if (id < layer) c.below[id] = w;
    }
    c.hidden = stream.copy();
    stream_checkpoint_bytes_ += stream.bytes();
    stream_checkpoints_.emplace(layer, std::move(c));
  }

  // The first layer the walk must run: past the highest checkpoint at or below replay_until_ whose
  // windows below are the ones the replay would run (the stream then holds it).
  int64_t restore_stream_checkpoint(ActivationStream& stream) const {
    for (auto it = stream_checkpoints_.rbegin(); it != stream_checkpoints_.rend(); ++it) {
      if (it->first > replay_until_) continue;
      const bool same = std::all_of(it->second.below.begin(), it->second.below.end(), [&](const auto& entry) {
        const auto now = result_.windows.find(entry.first);
        return now != result_.windows.end() && now->second == entry.second;
      });
      if (!same) continue;
      stream.assign(it->second.hidden);
      return it->first;
    }
    return 0;
  }

  // Records a layer's decision: its curves, choice and bytes.
  std::vector<int64_t> record_decision(const std::vector<solve::Group>& groups, const std::vector<size_t>& choice,
                                       LayerReport& report) {
    std::vector<int64_t> windows;
    for (size_t h = 0; h < groups.size(); ++h) {
      const auto& option = groups[h].options[choice[h]];
      windows.push_back(option.window);
      report.bytes_spent += option.bytes;
    }
    spent_ += report.bytes_spent;
    HEADWISE_CHECK(spent_ + report.planned_ahead <= options_.global_budget_bytes, "controller overspent at layer {}",
                   report.layer_id);
    append(decided_groups_, groups);
    append(decided_choice_, choice);
    append(result_.curves, to_curves(groups));
    return windows;
  }

  // answer-kl: the heads of a layer are decided together, because they back each other up: a
  // head that looks free to cut while the others keep the needle may be the last one holding it
  // once they are cut. The controller gives the layer its bytes as for block-mse (its curves
  // measured with the other heads at the top level, the layers above priced by the probe).
  // Within them, a greedy descent on the *joint* answer KL: from every head at the top level,
  // take the cut with the least KL added per byte saved, measured with the other heads at their
  // current windows, until the layer fits; keep cutting while a cut adds less KL per byte than
  // the controller's price λ (those bytes are worth more in the layers above); then lengthen
  // within the allowance only where a lengthening removes more than λ per byte. Each step is
  // conditioned on the steps before, as SeqCalib conditions each layer on the layers below.
  // Without the price, the relaxed allowance was spent in full on the first global layer and
  // left the last one short (in-sample answer KL 3.95 against 2.38 with it, default model, 25%).
  std::vector<int64_t> decide_jointly(int64_t layer_id, ActivationStream& stream, LayerReport& report,
                                      const SpanSite* given = nullptr) {
    if (!options_.conditioned) return record_decision(probe_groups_.at(layer_id), unconditioned_plan_.at(layer_id), report);
    std::map<std::vector<size_t>, double> memo;
    std::optional<SpanSite> captured;
    LayerMeasure layer_cost;
    size_t known = 0;  // assignments measured before this layer's walk (the probe's)
    if (span()) {
      // The lowest global layer sees the full-KV stream the probe measured (nothing below it is cut).
      const bool lowest = layer_id == spec_.global_layer_ids().front() && probe_memo_.contains(layer_id);
      if (lowest) memo = probe_memo_.at(layer_id);
      known = memo.size();
      const SpanSite& site = lowest   ? span_->reference_site(layer_id)
                             : given ? *given
                                     : captured.emplace(span_->capture(layer_id, stream));
      layer_cost = span_layer_measure(site, memo);
      // A small layer's every joint assignment in one batch: one run of the layers above.
      const std::vector<std::vector<size_t>> all = every_assignment(static_cast<size_t>(spec_.layer(layer_id).attention->num_kv_heads));
      if (!all.empty()) layer_cost.prefetch(all);
    } else {
      layer_cost.measure = layer_measure(*answer_kl_, sensitivity_.get(), layer_id, stream, memo);
    }
    const auto& measured = layer_cost.measure;
    const auto& prefetch = layer_cost.prefetch;
    const auto& layer = spec_.layer(layer_id);
    const auto heads = static_cast<size_t>(layer.attention->num_kv_heads);
    std::vector<size_t> assign(heads, options_.ladder.size() - 1);
    std::vector<solve::Group> groups = marginal_groups(layer_id, assign, measured, prefetch);
    const auto joint = with_extrapolated_levels(measured, groups);
    const int64_t allowance = price_layer(layer_id, groups, report);
    if (options_.joint_heads) {
      assign = greedy_joint_descent(groups, allowance, joint, report.lambda, prefetch);
      if (sensitivity_) relinearise_and_improve(layer_id, stream, groups, allowance, assign, joint);
      groups = marginal_groups(layer_id, assign, joint, prefetch);
    } else {
      assign = solve::solve_exact(groups, allowance).choice;
    }
    result_.answer_kl_evaluations += static_cast<int64_t>(memo.size() - known);
    spdlog::debug("layer {}: windows [{}], joint {} {:.6g} ({} evaluations)", layer_id, labels_of(assign),
                  measured_label(), joint(assign), memo.size() - known);
    if (result_.validation) validate_joint_decision(layer_id, stream, assign, joint, groups, allowance, report.lambda);
    return record_decision(groups, assign, report);
  }

  // The joint measure plus, for each head at a level the sequences cannot measure, that level's
  // extrapolated cost on the head's curve (`curves`, with the other heads at the top level):
  // measured, such a level reads as free, and a descent would take it first.
  std::function<double(const std::vector<size_t>&)> with_extrapolated_levels(
      std::function<double(const std::vector<size_t>&)> measured, const std::vector<solve::Group>& curves) const {
    if (options_.extrapolation != Extrapolation::kPowerLaw || options_.unmeasured_levels.empty()) return measured;
    std::vector<std::vector<double>> penalty(curves.size());
    for (size_t h = 0; h < curves.size(); ++h) {
      for (const auto& o : curves[h].options) {
        const bool unmeasured = std::find(options_.unmeasured_levels.begin(), options_.unmeasured_levels.end(),
                                          o.window) != options_.unmeasured_levels.end();
        penalty[h].push_back(unmeasured ? o.distortion : 0.0);
      }
    }
    return [measured = std::move(measured), penalty](const std::vector<size_t>& levels) {
      double total = measured(levels);
      for (size_t h = 0; h < levels.size(); ++h) total += penalty[h][levels[h]];
      return total;
    };
  }

  // answer-grad: the prediction is a linearisation at full KV, blind to heads whose redundancy
  // saturates (cutting one of two changes nothing to first order, cutting both is predicted free
  // as well). Re-linearise at the decision and take the moves the new prediction says help, until
  // none does or kRelinearisations passes.
  static constexpr int kRelinearisations = 3;
  void relinearise_and_improve(int64_t layer_id, ActivationStream& stream, const std::vector<solve::Group>& groups,
                               int64_t allowance, std::vector<size_t>& assign,
                               const std::function<double(const std::vector<size_t>&)>& predicted) const {
    for (int pass = 0; pass < kRelinearisations; ++pass) {
      sensitivity_->prepare(layer_id, stream, windows_of(assign));
      bool improved = false;
      while (best_swap(groups, assign, allowance, predicted)) improved = true;
      if (!improved) break;
    }
  }


  // The span measure decides a layer inside the layer's own pass over the stream: its attention
  // inputs give the site, the decision gives the windows its output is computed with. One pass
  // over the layer instead of a capture pass and a propagation pass (one micro-batch, no state).
  class DecidingCore final : public arch::AttentionCore {
   public:
    using Decide = std::function<std::vector<int64_t>(const arch::AttentionInputs&)>;
    DecidingCore(int64_t sinks, int64_t chunk, Decide decide) : sinks_(sinks), chunk_(chunk), decide_(std::move(decide)) {}
    at::Tensor attend(const arch::AttentionInputs& in) override {
      return arch::windowed_attention(in, decide_(in), sinks_, chunk_);
    }

   private:
    int64_t sinks_;
    int64_t chunk_;
    Decide decide_;
  };

  bool decides_in_its_pass(int64_t i, const ActivationStream& stream) const {
    return span() && options_.conditioned && stream.micro_batches() == 1 && spec_.layer(i).states.empty() &&
           !result_.validation && i != spec_.global_layer_ids().front();
  }

  void run_global_layer(int64_t i, ActivationStream& stream, PolicyAttentionCore& policy_core, LayerReport& report) {
    if (decides_in_its_pass(i, stream)) {
      std::vector<at::Tensor> input;  // the layer's input at the span, set before the pass
      DecidingCore core(options_.sink_tokens, model_.attention_chunk(), [&](const arch::AttentionInputs& in) {
        const SpanSite site = span_->site_of(i, std::move(input), {in});
        result_.windows[i] = decide_jointly(i, stream, report, &site);
        return result_.windows[i];
      });
      stream.apply([&](const at::Tensor& h) {
        input = {h.slice(1, span_->span_begin(), h.size(1)).clone()};
        return checked_finite(model_.run_layer(i, h, {&core, nullptr, 0}), i, spec_.layer(i).kind);
      });
      return;
    }
    if (answer_aware()) {
      result_.windows[i] = decide_jointly(i, stream, report);
      stream.apply([&](const at::Tensor& h) {
        return checked_finite(model_.run_layer(i, h, {&policy_core, nullptr, 0}), i, spec_.layer(i).kind);
      });
      return;
    }
    Accumulators accumulators;
    if (stream.micro_batches() == 1) {
      MeasuringCore core(options_, model_.attention_chunk(), accumulators, [&](int64_t layer_id) {
        result_.windows[layer_id] = decide(layer_id, accumulators.at(layer_id), report);
        return result_.windows[layer_id];
      });
      stream.apply([&](const at::Tensor& h) {
        return checked_finite(model_.run_layer(i, h, {&core, nullptr, 0}), i, spec_.layer(i).kind);
      });
      return;
    }
    // Several micro-batches: measure them all, decide, then propagate under the decision.
    MeasuringCore core(options_, model_.attention_chunk(), accumulators, nullptr);
    stream.visit([&](const at::Tensor& h) { model_.run_layer(i, h, {&core, nullptr, 0}); });
    result_.windows[i] = decide(i, accumulators.at(i), report);
    stream.apply([&](const at::Tensor& h) {
      return checked_finite(model_.run_layer(i, h, {&policy_core, nullptr, 0}), i, spec_.layer(i).kind);
    });
  }

  // Exact completion: spend what the controller left on the best upgrades.
  void complete() {
    result_.global_bytes_before_completion = spent_;
    const auto solution = solve::solve_upgrade(decided_groups_, decided_choice_, options_.global_budget_bytes);
    result_.completion_proven_optimal = solution.proven_optimal;
    result_.global_bytes = solution.total_bytes;
    result_.total_distortion = solution.total_distortion;
    result_.windows.clear();
    for (size_t g = 0; g < decided_groups_.size(); ++g) {
      const auto& group = decided_groups_[g];
      const auto& option = group.options[solution.choice[g]];
      result_.windows[group.layer_id].push_back(option.window);
      result_.expected_distortion[group.layer_id].push_back(option.distortion);
    }
    HEADWISE_CHECK(result_.global_bytes <= options_.global_budget_bytes, "policy exceeds the budget");
    spdlog::info("completion: {} → {} of {} for global KV", format_bytes(spent_), format_bytes(result_.global_bytes),
                 format_bytes(options_.global_budget_bytes));
  }

  // Fresh conditioning: the completion may lengthen windows of a layer below other global layers,
  // which were decided on the narrower stream. Re-walk the layers above the lowest one it moved,
  // the layers up to it fixed at their completed windows, then complete again; keep the re-walk
  // only if it lowers the end-to-end answer KL (measured), and stop when the completion moves
  // nothing below a global layer or after kRewalks passes.
  static constexpr int kRewalks = 2;
  void rewalk_while_completion_moves_lower_layers() {
    result_.answer_kl_by_pass = {result_.answer_kl_policy};
    for (int pass = 0; pass < kRewalks; ++pass) {
      const std::optional<int64_t> lowest = lowest_changed_layer_below_a_global_layer(walk_windows());
      if (!lowest) return;
      spdlog::info("re-walk {}: the completion moved windows of layer {}; re-deciding the layers above it", pass + 1,
                   *lowest);
      const auto outcome = rewalk_above(*lowest, result_.windows);
      result_.answer_kl_by_pass.push_back(outcome.tried_kl);
      if (!outcome.kept) return;
      result_.rewalks = pass + 1;
    }
  }

  // Cross-layer re-solve: the walk gives each layer its bytes before the layers above are measured
  // on the conditioned stream, priced by the probe's curves of those layers (measured with full
  // KV below and the other heads at full). Where that price was wrong, a lower layer keeps bytes
  // a higher one needed more, and the completion (upgrades only) cannot take them back. Once every
  // layer has its conditioned curves (each head's, around the layer's decision), solve the whole
  // budget exactly over them; where that moves bytes out of or into a layer below a global layer,
  // fix the layers up to the lowest such one at the re-solved windows, re-walk the layers above,
  // complete, and keep the result only if the end-to-end answer KL drops. At most kResolves passes.
  // On the 8K default model at 50% of full KV, the walk kept 4096 tokens for one head of layer 1
  // and left layer 3 a head at 1024 that cost 0.11 in answer KL.
  static constexpr int kResolves = 2;
  void resolve_across_layers() {
    result_.answer_kl_by_resolve = {result_.answer_kl_policy};
    for (int pass = 0; pass < kResolves; ++pass) {
      const Windows proposed =
          decided_windows(solve::solve_exact(decided_groups_, options_.global_budget_bytes).choice);
      const std::optional<int64_t> lowest = lowest_changed_layer_below_a_global_layer(proposed);
      if (!lowest) return;
      spdlog::info("re-solve {}: the exact solve over the conditioned curves moves layer {} to [{}]; re-deciding the "
                   "layers above it",
                   pass + 1, *lowest, fmt::join(proposed.at(*lowest), ","));
      const auto outcome = rewalk_above(*lowest, proposed);
      result_.answer_kl_by_resolve.push_back(outcome.tried_kl);
      if (!outcome.kept) return;
      result_.resolves = pass + 1;
    }
  }

  // The span measure's cross-layer re-solve (see resolve_across_layers): one pass, kept when the
  // re-walk's end-to-end answer divergence (read off its own final stream) is below the first
  // walk's, both before their completions: no forward beyond the re-walk itself.
  void resolve_across_layers_by_walks() {
    result_.answer_kl_by_resolve = {result_.answer_kl_walk};
    const Windows proposed = decided_windows(solve::solve_exact(decided_groups_, options_.global_budget_bytes).choice);
    const std::optional<int64_t> lowest = lowest_changed_layer_below_a_global_layer(proposed);
    if (!lowest) return;
    spdlog::info("re-solve: the exact solve over the conditioned curves moves layer {} to [{}]; re-deciding the layers "
                 "above it",
                 *lowest, fmt::join(proposed.at(*lowest), ","));
    const auto kept_result = result_;
    const auto kept = std::make_tuple(decided_groups_, decided_choice_, spent_, replay_until_);
    result_.windows = proposed;
    fix_layers_up_to(*lowest);
    rewalking_ = true;
    walk();
    rewalking_ = false;
    complete();
    result_.answer_kl_by_resolve.push_back(result_.answer_kl_walk);
    if (!(result_.answer_kl_walk < kept_result.answer_kl_walk)) {
      spdlog::info("re-solved walk: {} {:.6g}, not below {:.6g}: kept the first walk's policy", measured_label(),
                   result_.answer_kl_walk, kept_result.answer_kl_walk);
      auto tried = result_.answer_kl_by_resolve;
      result_ = kept_result;
      result_.answer_kl_by_resolve = std::move(tried);
      std::tie(decided_groups_, decided_choice_, spent_, replay_until_) = kept;
      return;
    }
    spdlog::info("re-solved walk: {} {:.6g} (was {:.6g}): kept", measured_label(), result_.answer_kl_walk,
                 kept_result.answer_kl_walk);
    result_.resolves = 1;
  }

  struct RewalkOutcome {
    double tried_kl = 0.0;
    bool kept = false;
  };

  // Fixes the global layers up to `lowest` at `windows`, re-walks the layers above on that stream
  // and completes; keeps the new policy only if its measured end-to-end answer KL is lower.
  RewalkOutcome rewalk_above(int64_t lowest, const Windows& windows) {
    const auto kept_result = result_;
    const auto kept = std::make_tuple(decided_groups_, decided_choice_, spent_, replay_until_);
    result_.windows = windows;
    fix_layers_up_to(lowest);
    rewalking_ = true;
    walk();
    rewalking_ = false;
    complete();
    measure_completion_effect();
    const double kl = result_.answer_kl_policy;
    if (!(kl < kept_result.answer_kl_policy)) {
      spdlog::info("{} {:.6g}, not below {:.6g}: kept the previous policy", measured_label(), kl,
                   kept_result.answer_kl_policy);
      result_ = kept_result;
      std::tie(decided_groups_, decided_choice_, spent_, replay_until_) = kept;
      return {kl, false};
    }
    spdlog::info("{} {:.6g} (was {:.6g}): kept", measured_label(), kl, kept_result.answer_kl_policy);
    return {kl, true};
  }

  // The lowest global layer whose windows differ between `from` and the policy's, when a global
  // layer lies above it.
  std::optional<int64_t> lowest_changed_layer_below_a_global_layer(const Windows& from) const {
    const int64_t top = spec_.global_layer_ids().back();
    for (const auto& [layer, windows] : from) {
      if (layer < top && windows != result_.windows.at(layer)) return layer;
    }
    return std::nullopt;
  }

  Windows walk_windows() const { return decided_windows(decided_choice_); }

  // The windows of the decided groups at `choice` (one option index per group), by layer.
  Windows decided_windows(const std::vector<size_t>& choice) const {
    Windows windows;
    for (size_t g = 0; g < decided_groups_.size(); ++g) {
      windows[decided_groups_[g].layer_id].push_back(decided_groups_[g].options[choice[g]].window);
    }
    return windows;
  }

  // The layers up to `layer` become decided at their completed windows (replayed by the next
  // walk); everything above is forgotten.
  void fix_layers_up_to(int64_t layer) {
    std::vector<solve::Group> groups;
    std::vector<size_t> choice;
    spent_ = 0;
    std::vector<size_t> next_head;
    for (const auto& group : decided_groups_) {
      if (group.layer_id > layer) break;
      const int64_t window = result_.windows.at(group.layer_id).at(static_cast<size_t>(group.kv_head));
      size_t level = 0;
      while (group.options[level].window != window) ++level;
      groups.push_back(group);
      choice.push_back(level);
      spent_ += group.options[level].bytes;
    }
    decided_groups_ = std::move(groups);
    decided_choice_ = std::move(choice);
    std::erase_if(result_.windows, [layer](const auto& entry) { return entry.first > layer; });
    std::erase_if(result_.curves, [layer](const HeadCurve& c) { return c.layer_id > layer; });
    std::erase_if(result_.layers, [layer](const LayerReport& r) { return r.layer_id > layer; });
    if (result_.validation) {
      std::erase_if(result_.validation->joint_decisions, [layer](const auto& d) { return d.layer_id > layer; });
    }
    result_.expected_distortion.clear();
    replay_until_ = layer;
  }

  // Upper layers were measured on the stream of the walk's windows; the completion may lengthen
  // some of them afterwards. Measure what that does end to end instead of assuming it.
  void measure_completion_effect() {
    result_.windows_moved_by_completion = 0;
    for (const auto& [layer, windows] : walk_windows()) {
      const auto& final_windows = result_.windows.at(layer);
      for (size_t h = 0; h < windows.size(); ++h) result_.windows_moved_by_completion += windows[h] != final_windows[h];
    }
    if (result_.windows_moved_by_completion == 0) {
      result_.answer_kl_policy = result_.answer_kl_walk;
    } else {
      ActivationStream embedded(model_, local_sequences_, options_.micro_batch, options_.activations);
      result_.answer_kl_policy = answer_kl_->evaluate_policy(embedded, result_.windows);
    }
    spdlog::info("{} end to end: {:.6g} after the walk, {:.6g} after completion ({} windows moved)", measured_label(),
                 result_.answer_kl_walk, result_.answer_kl_policy, result_.windows_moved_by_completion);
  }

  arch::DecoderModel& model_;
  const arch::ModelSpec& spec_;
  const std::vector<std::vector<int64_t>>& sequences_;
  const SeqCalibOptions& options_;
  dist::Collective& world_;
  std::vector<size_t> local_index_;  // this rank's sequences, in order
  std::vector<std::vector<int64_t>> local_sequences_;
  std::vector<std::vector<int64_t>> local_answers_;
  SeqCalibResult result_;
  std::map<int64_t, std::vector<solve::Group>> probe_groups_;
  std::map<int64_t, std::vector<size_t>> unconditioned_plan_;
  std::vector<solve::Group> decided_groups_;
  std::vector<size_t> decided_choice_;
  int64_t spent_ = 0;
  int64_t replay_until_ = -1;  // resume: layers 0..replay_until_ were decided before
  bool rewalking_ = false;
  std::map<int64_t, StreamCheckpoint> stream_checkpoints_;
  int64_t stream_checkpoint_bytes_ = 0;
  std::unique_ptr<AnswerKl> answer_kl_;  // the exact answer measures (and the span measure's validation)
  AnswerSpan* span_ = nullptr;           // the answer-span measures: options_.span or own_span_
  std::map<int64_t, std::map<std::vector<size_t>, double>> probe_memo_;  // span probe: layer → assignment → measure
  std::unique_ptr<AnswerSpan> own_span_;
  std::unique_ptr<AnswerSensitivity> sensitivity_;  // answer-grad only
};

}  // namespace

at::Tensor PolicyAttentionCore::attend(const arch::AttentionInputs& in) {
  if (in.sliding_window > 0) return arch::windowed_attention(in, in.sliding_window, 0, chunk_);
  const auto it = windows_.find(in.layer_id);
  HEADWISE_CHECK(it != windows_.end(), "no windows for global layer {}", in.layer_id);
  return arch::windowed_attention(in, it->second, sink_tokens_, chunk_);
}

int64_t default_probe_samples(int64_t sequences) { return (sequences + 1) / 2; }

int64_t effective_probe_samples(int64_t requested, int64_t sequences) {
  if (requested < 0) throw_input_error("--probe-samples must not be negative (got {})", requested);
  return requested > 0 ? std::min(requested, sequences) : default_probe_samples(sequences);
}

SeqCalibResult run_seqcalib(arch::DecoderModel& model, const std::vector<std::vector<int64_t>>& sequences,
                            const SeqCalibOptions& options) {
  // answer-grad back-propagates through the layers above: no inference tensors then. Everything
  // else runs without a graph (the measure opens one where it needs it).
  const c10::InferenceMode inference(options.measure != DistortionMeasure::kAnswerGrad);
  const at::NoGradGuard no_grad;
  return SeqCalibRun(model, sequences, options).run();
}

}  // namespace headwise::calib
