#include "headwise/calib/seqcalib.hpp"

#include <spdlog/spdlog.h>

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <optional>

#include "headwise/arch/attention.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/walk_state.hpp"
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

// Names the KV head(s) whose inputs are NaN/Inf: keys and values per KV head; queries, output
// gate and o_proj columns per query head, mapped to their KV head. A bad weight in one head's
// rows poisons every head's measured distortion (they share the block output), so this is
// the only place the head can still be told; a few reductions per global layer.
void check_heads_finite(const arch::AttentionInputs& in) {
  const int64_t kv = in.k.size(1), hq = in.q.size(1), group = hq / kv;
  auto bad_per_head = [](const at::Tensor& t, int64_t head_dim_index) {  // any non-finite per head
    at::Tensor bad = at::logical_not(at::isfinite(t)).movedim(head_dim_index, 0);
    return bad.flatten(1).any(1);
  };
  at::Tensor query_side = bad_per_head(in.q, 1);
  if (in.output_gate.defined()) query_side = query_side | bad_per_head(in.output_gate, 2);
  if (in.o_proj_weight.defined()) query_side = query_side | bad_per_head(in.o_proj_weight.view({in.o_proj_weight.size(0), hq, -1}), 1);
  const at::Tensor bad = (bad_per_head(in.k, 1) | bad_per_head(in.v, 1) | query_side.view({kv, group}).any(1)).cpu();
  if (!bad.any().item<bool>()) return;
  std::vector<int64_t> heads;
  for (int64_t h = 0; h < kv; ++h) {
    if (bad[h].item<bool>()) heads.push_back(h);
  }
  throw NumericError(fmt::format("layer {} KV head {}: attention inputs are NaN/Inf (bad KV heads: {}): check that "
                                 "head's rows of the q/k/v/gate projections and its o_proj columns",
                                 in.layer_id, heads.front(), fmt::join(heads, ",")));
}

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

template <typename T>
void append(std::vector<T>& to, const std::vector<T>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

// A NaN/Inf in the hidden states would otherwise surface layers later as a NaN distortion of
// some unrelated head, or silently as garbage curves. One reduction per layer output is cheap
// next to the layer itself.
at::Tensor checked_finite(at::Tensor hidden, int64_t layer_id, arch::LayerKind kind) {
  if (at::isfinite(hidden).all().item<bool>()) return hidden;
  const at::Tensor bad = at::nonzero(at::logical_not(at::isfinite(hidden)))[0].cpu();
  throw NumericError(fmt::format("layer {} ({}): output hidden state is NaN/Inf (first at sequence {}, token {}, channel "
                                 "{}): check the layer's weights",
                                 layer_id, layer_kind_name(kind), bad[0].item<int64_t>(), bad[1].item<int64_t>(),
                                 bad[2].item<int64_t>()));
}

int64_t read_peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

// The whole run: probe pass, then the conditioned walk.
class SeqCalibRun {
 public:
  SeqCalibRun(arch::DecoderModel& model, const std::vector<std::vector<int64_t>>& sequences, const SeqCalibOptions& options)
      : model_(model), spec_(model.spec()), sequences_(sequences), options_(options) {}

  SeqCalibResult run() {
    const auto start = Clock::now();
    reset_peak_device_bytes(model_.device());
    validate();
    if (options_.resume) {
      restore(*options_.resume);
    } else {
      probe();
    }
    if (!options_.conditioned) plan_unconditioned();
    walk();
    complete();
    result_.total_seconds = seconds_since(start);
    result_.peak_rss_bytes = read_peak_rss_bytes();
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

  // Unconditioned curves: every global layer measured with full KV below.
  void probe() {
    const auto start = Clock::now();
    const int64_t samples = effective_probe_samples(options_.probe_samples, static_cast<int64_t>(sequences_.size()));
    ActivationStream stream(model_, {sequences_.begin(), sequences_.begin() + samples}, options_.micro_batch,
                            options_.activations);
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
    for (auto& [layer_id, acc] : accumulators) {
      acc.check_finite(layer_id);
      probe_groups_[layer_id] = layer_groups(spec_.layer(layer_id), acc, options_);
      append(result_.probe_curves, to_curves(probe_groups_[layer_id]));
    }
    std::vector<solve::Group> all;
    for (const auto& [id, groups] : probe_groups_) append(all, groups);
    result_.probe_lambda = solve::min_fitting_lambda(all, options_.global_budget_bytes);
    result_.probe_seconds = seconds_since(start);
    spdlog::info("probe: {} global layers measured on {} sequences in {:.1f}s, lambda {:.4g}", probe_groups_.size(),
                 samples, result_.probe_seconds, result_.probe_lambda);
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
  std::vector<int64_t> decide(int64_t layer_id, const measure::DistortionAccumulator& acc, LayerReport& report) {
    acc.check_finite(layer_id);
    std::vector<solve::Group> groups = options_.conditioned ? layer_groups(spec_.layer(layer_id), acc, options_)
                                                            : probe_groups_.at(layer_id);
    const std::vector<solve::Group> future = future_probe_groups(layer_id);
    const int64_t remaining = options_.global_budget_bytes - spent_;
    std::vector<size_t> choice;
    if (!options_.conditioned) {
      choice = unconditioned_plan_.at(layer_id);
    } else {
      std::vector<solve::Group> combined = groups;
      append(combined, future);
      report.lambda = solve::min_fitting_lambda(combined, remaining);
      choice = solve::relax_at(groups, report.lambda).choice;
      report.planned_ahead = future.empty() ? 0 : solve::relax_at(future, report.lambda).total_bytes;
    }
    std::vector<int64_t> windows;
    for (size_t h = 0; h < groups.size(); ++h) {
      const auto& option = groups[h].options[choice[h]];
      windows.push_back(option.window);
      report.bytes_spent += option.bytes;
    }
    spent_ += report.bytes_spent;
    HEADWISE_CHECK(spent_ + report.planned_ahead <= options_.global_budget_bytes, "controller overspent at layer {}", layer_id);
    append(decided_groups_, groups);
    append(decided_choice_, choice);
    append(result_.curves, to_curves(groups));
    return windows;
  }

  void walk() {
    ActivationStream stream(model_, sequences_, options_.micro_batch, options_.activations);
    result_.activations = stream.placement_name();
    PolicyAttentionCore policy_core(result_.windows, options_.sink_tokens, model_.attention_chunk());
    Progress progress(options_.conditioned ? "SeqCalib" : "calibrate (unconditioned)", spec_.num_layers());
    for (int64_t i = 0; i < spec_.num_layers(); ++i) {
      if (i <= replay_until_) {  // decided before the interruption: recompute the stream only
        stream.apply([&](const at::Tensor& h) { return model_.run_layer(i, h, {&policy_core, nullptr, 0}); });
        model_.release_layer(i);
        progress.update(i + 1, fmt::format("layer {} replayed", i));
        continue;
      }
      const auto start = Clock::now();
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
      result_.layers.push_back(report);
      progress.update(i + 1, spec_.layer(i).is_global()
                                 ? fmt::format("layer {} global: {} spent, lambda {:.3g}", i,
                                               format_bytes(spent_), report.lambda)
                                 : fmt::format("layer {} {}", i, report.kind));
      if (spec_.layer(i).is_global() && options_.checkpoint) options_.checkpoint(state_after(i));
      if (spec_.layer(i).is_global() && options_.after_global_layer) options_.after_global_layer(i);
    }
    progress.finish();
  }

  void run_global_layer(int64_t i, ActivationStream& stream, PolicyAttentionCore& policy_core, LayerReport& report) {
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

  arch::DecoderModel& model_;
  const arch::ModelSpec& spec_;
  const std::vector<std::vector<int64_t>>& sequences_;
  const SeqCalibOptions& options_;
  SeqCalibResult result_;
  std::map<int64_t, std::vector<solve::Group>> probe_groups_;
  std::map<int64_t, std::vector<size_t>> unconditioned_plan_;
  std::vector<solve::Group> decided_groups_;
  std::vector<size_t> decided_choice_;
  int64_t spent_ = 0;
  int64_t replay_until_ = -1;  // resume: layers 0..replay_until_ were decided before
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
  c10::InferenceMode inference;
  return SeqCalibRun(model, sequences, options).run();
}

}  // namespace headwise::calib
