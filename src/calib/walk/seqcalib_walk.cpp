#include "calib/walk/seqcalib_walk.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "calib/measures/measure.hpp"
#include "calib/walk/finite_checks.hpp"
#include "calib/walk/seqcalib_curves.hpp"
#include "headwise/core/progress.hpp"
#include "headwise/core/units.hpp"

namespace headwise::calib::seqcalib {

at::Tensor run_checked(const RunInputs& in, int64_t i, const at::Tensor& h,
                       arch::AttentionCore& core) {
  return checked_finite(in.model.run_layer(i, h, {&core, nullptr, 0}), i, in.spec.layer(i).kind);
}

namespace {

ResumeCheckpoint state_after(int64_t layer_id, const RunState& state, const WalkRecord& walked) {
  const Decisions& decisions = walked.decisions;
  return {layer_id,
          state.probe_groups,
          state.probe_lambda,
          state.probe_seconds,
          walk_windows(decisions),
          decisions.groups,
          decisions.choice,
          decisions.spent,
          walked.layers};
}

}  // namespace

void StreamCheckpoints::keep(int64_t layer, const ActivationStream& stream,
                             const Windows& windows) {
  if (by_layer_.contains(layer) || bytes_ + stream.bytes() > kStreamCheckpointLimitBytes) return;
  Checkpoint c;
  for (const auto& [id, w] : windows) {
    if (id < layer) c.below[id] = w;
  }
  c.hidden = stream.copy();
  bytes_ += stream.bytes();
  by_layer_.emplace(layer, std::move(c));
}

int64_t StreamCheckpoints::restore(ActivationStream& stream, int64_t replay_until,
                                   const Windows& windows) const {
  for (auto it = by_layer_.rbegin(); it != by_layer_.rend(); ++it) {
    if (it->first > replay_until) continue;
    const bool same =
        std::all_of(it->second.below.begin(), it->second.below.end(), [&](const auto& entry) {
          const auto now = windows.find(entry.first);
          return now != windows.end() && now->second == entry.second;
        });
    if (!same) continue;
    stream.assign(it->second.hidden);
    return it->first;
  }
  return 0;
}

void restore(const ResumeCheckpoint& saved, RunState& state) {
  state.probe_groups = saved.probe_groups;
  state.probe_lambda = saved.probe_lambda;
  state.probe_seconds = saved.probe_seconds;
  state.walk.layers = saved.layers;
  state.decisions.groups = saved.decided_groups;
  state.decisions.choice = saved.decided_choice;
  state.decisions.spent = saved.spent;
  state.decisions.replay_until = saved.last_layer;
  spdlog::info("resuming after layer {}: {} global layers decided, {} spent", saved.last_layer,
               saved.windows.size(), format_bytes(state.decisions.spent));
}

WalkRecord walk(const RunInputs& in, Measure& measure, RunState& state, WalkPass pass) {
  const arch::ModelSpec& spec = in.spec;
  WalkRecord walked{state.decisions, state.walk.layers, -1.0, {}};
  ActivationStream stream(in.model, in.local_sequences, in.options.micro_batch,
                          in.options.activations);
  walked.activations = stream.placement_name();
  Progress progress(in.options.conditioned ? "SeqCalib" : "calibrate (unconditioned)",
                    spec.num_layers());
  const int64_t replay_until = walked.decisions.replay_until;
  const int64_t resume_at =
      state.stream_checkpoints.restore(stream, replay_until, walk_windows(walked.decisions));
  // Replayed layers run under their recorded windows; other non-global layers natively.
  PolicyAttentionCore replay(walk_windows(walked.decisions), in.options.sink_tokens,
                             in.model.attention_chunk());
  PolicyAttentionCore native({}, in.options.sink_tokens, in.model.attention_chunk());
  for (int64_t i = resume_at; i < spec.num_layers(); ++i) {
    if (spec.layer(i).is_global() && i > replay_until)
      state.stream_checkpoints.keep(i, stream, walk_windows(walked.decisions));
    if (i <= replay_until) {  // decided before: recompute the stream only
      stream.apply([&](const at::Tensor& h) {
        return in.model.run_layer(i, h, {&replay, nullptr, 0});
      });
      in.model.release_layer(i);
      progress.update(i + 1, fmt::format("layer {} replayed", i));
      continue;
    }
    const auto start = Clock::now();
    const int64_t sent_before = in.world.bytes_sent();
    in.model.prefetch_layer(i + 1);  // loads while layer i computes
    LayerReport report{i, std::string(layer_kind_name(spec.layer(i).kind))};
    if (spec.layer(i).is_global()) {
      walked.decisions.add(measure.decide_and_run(in, state, walked.decisions, i, stream, report));
    } else {
      stream.apply([&](const at::Tensor& h) { return run_checked(in, i, h, native); });
    }
    in.model.release_layer(i);
    report.seconds = seconds_since(start);
    report.exchanged_bytes = in.world.bytes_sent() - sent_before;
    walked.layers.push_back(report);
    progress.update(i + 1, spec.layer(i).is_global()
                               ? fmt::format("layer {} global: {} spent, lambda {:.3g}", i,
                                             format_bytes(walked.decisions.spent), report.lambda)
                               : fmt::format("layer {} {}", i, report.kind));
    if (spec.layer(i).is_global() && in.options.checkpoint && pass == WalkPass::kFirst) {
      in.options.checkpoint(state_after(i, state, walked));
    }
  }
  progress.finish();
  // The stream has passed every layer under the walk's windows: its end-to-end value costs no
  // further run.
  walked.divergence = measure.value_of_walk(stream);
  return walked;
}

void adopt(RunState& state, WalkRecord walked) {
  state.decisions = std::move(walked.decisions);
  state.walk = {std::move(walked.layers), walked.divergence, std::move(walked.activations)};
}

}  // namespace headwise::calib::seqcalib
