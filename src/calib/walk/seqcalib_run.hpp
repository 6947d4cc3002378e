#pragma once
// The state one SeqCalib run shares between its units (seqcalib_*.cpp and the measures in
// measures/): what the run was given and this rank's shard of it (RunInputs, fixed once the run
// starts), and what it has measured and decided so far (RunState). The measure the run uses is an
// object of its own (measures/measure.hpp); no unit outside measures/ asks which one it is.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/answer_reference.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/core/clock.hpp"
#include "headwise/dist/collective.hpp"
#include "headwise/measure/distortion.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::calib::seqcalib {

using Clock = std::chrono::steady_clock;
using Windows = std::map<int64_t, std::vector<int64_t>>;
using Accumulators = std::map<int64_t, measure::DistortionAccumulator>;
// One layer's measure by joint assignment (a ladder-level index per KV head).
using LevelMemo = std::map<std::vector<size_t>, double>;

using headwise::seconds_since;

template <typename T>
void append(std::vector<T>& to, const std::vector<T>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

// What the run was given, and this rank's shard of the sequences.
struct RunInputs {
  RunInputs(arch::DecoderModel& model, const std::vector<std::vector<int64_t>>& sequences,
            const SeqCalibOptions& options);

  // Throws on inputs no run can start from.
  void validate() const;
  // Takes this rank's micro-batches (all of them in one process), and their answer positions.
  void take_shard();

  // The shard's sequences among the first `samples` (a prefix of the shard: shards are in order).
  std::vector<std::vector<int64_t>> local_prefix(int64_t samples) const;
  // Every rank's sums for one layer, merged (exactly: the result does not depend on the split).
  measure::DistortionAccumulator merged_over_ranks(
      int64_t layer_id, const measure::DistortionAccumulator& local) const;

  // Sequences the probe measures (SeqCalibOptions::probe_samples, else the default share).
  int64_t probe_samples() const {
    return effective_probe_samples(options.probe_samples, static_cast<int64_t>(sequences.size()));
  }
  // What the answer measures average, as the logs name it.
  const char* measured_label() const;

  // The windows of one layer for a ladder-level index per head.
  std::vector<int64_t> windows_of(const std::vector<size_t>& levels) const;
  // The same as a log shows it ("full", not the sentinel).
  std::string labels_of(const std::vector<size_t>& levels) const;

  arch::DecoderModel& model;
  const arch::ModelSpec& spec;
  const std::vector<std::vector<int64_t>>& sequences;
  const SeqCalibOptions& options;
  dist::Collective& world;
  std::vector<size_t> local_index;  // this rank's sequences, in order
  std::vector<std::vector<int64_t>> local_sequences;
  std::vector<std::vector<int64_t>> local_answers;
};

// One global layer's decision: its curves (a group per KV head), the option chosen in each, the
// windows and bytes they give.
struct LayerDecision {
  std::vector<solve::Group> groups;
  std::vector<size_t> choice;
  std::vector<int64_t> windows;
  int64_t bytes = 0;
  std::optional<DecisionNoise> noise;  // how sure it is, when the measure keeps per-sequence values
};

// The walk's decisions, in decision order: what a walk returns. A re-walk that is not kept puts
// the previous ones back whole.
struct Decisions {
  std::vector<solve::Group> groups;
  std::vector<size_t> choice;
  int64_t spent = 0;
  int64_t replay_until = -1;  // layers 0..replay_until were decided before the walk (replayed)
  // Each decided layer's noise by layer id (a re-walk's decision of a layer replaces its first).
  std::map<int64_t, DecisionNoise> noise;

  void add(const LayerDecision& layer) {
    append(groups, layer.groups);
    append(choice, layer.choice);
    spent += layer.bytes;
    if (layer.noise) noise.insert_or_assign(layer.noise->layer_id, *layer.noise);
  }
};

// The walk's stream entering a global layer, with the windows of the global layers below it as
// the walk ran them: a re-walk that replays the same windows below starts there instead of at the
// embeddings. Kept while they fit kStreamCheckpointLimitBytes (the same tensors a replay would
// compute).
class StreamCheckpoints {
 public:
  // Keeps the stream entering `layer`, run under `windows` below it, while the copies fit.
  void keep(int64_t layer, const ActivationStream& stream, const Windows& windows);
  // The first layer the walk must run: past the highest checkpoint at or below `replay_until`
  // whose windows below are those of `windows` (the stream then holds it).
  int64_t restore(ActivationStream& stream, int64_t replay_until, const Windows& windows) const;

 private:
  struct Checkpoint {
    Windows below;
    std::vector<at::Tensor> hidden;
  };
  std::map<int64_t, Checkpoint> by_layer_;
  int64_t bytes_ = 0;
};

// What the walk measured beside its decisions: every layer's report, the measure's end-to-end
// value of the walk's windows, and where its activations lived.
struct WalkOutcome {
  std::vector<LayerReport> layers;
  double divergence = -1.0;  // -1 for a measure that scores no answers
  std::string activations;   // "device" or "host"
};

// The policy the run holds now: the exact completion of the decisions within the budget, and what
// it does end to end.
struct Completion {
  Windows windows;  // global layer → window per KV head
  std::map<int64_t, std::vector<double>> expected_distortion;  // at those windows
  int64_t global_bytes = 0;
  int64_t bytes_before = 0;  // what the decisions spent
  double total_distortion = 0.0;
  bool proven_optimal = true;
  double divergence = -1.0;   // end to end, where the measure scores answers
  int64_t windows_moved = 0;  // by the completion from the walk's decisions
};

// What the passes after the completion tried (re-walks, re-solves): a record of every pass,
// including those discarded, which is why the run says it kept what it kept.
struct Refinements {
  int64_t rewalks = 0;  // kept
  std::vector<double> divergence_by_pass;
  int64_t resolves = 0;  // kept
  std::vector<double> divergence_by_resolve;
  std::vector<double> span_by_resolve;
};

// What the run has measured and decided so far. The result (SeqCalibResult) is assembled from it
// once, when the run ends.
struct RunState {
  std::map<int64_t, std::vector<solve::Group>> probe_groups;
  double probe_lambda = 0.0;  // where the probe's curves fit the budget
  double probe_seconds = 0.0;
  std::map<int64_t, LevelMemo> probe_memo;  // span probe: layer → assignment → measure
  std::map<int64_t, std::vector<size_t>> unconditioned_plan;
  Decisions decisions;
  WalkOutcome walk;
  Completion completion;
  Refinements refinements;
  std::optional<MeasureValidation> validation;  // opened by a measure the run validates
  int64_t answer_evaluations = 0;               // by the decisions the run holds
  StreamCheckpoints stream_checkpoints;
};

// What a pass that may be discarded (a re-walk, a re-solve) changes, put back whole when it is:
// the decisions, the walk's record, the completion, the validation of the decisions and the
// evaluations they cost. The record of the passes tried (Refinements) is not part of it.
struct Snapshot {
  Decisions decisions;
  WalkOutcome walk;
  Completion completion;
  std::optional<MeasureValidation> validation;
  int64_t answer_evaluations = 0;
};
Snapshot snapshot_of(const RunState& state);
void roll_back(RunState& state, Snapshot kept);

// The windows of the decided groups at `choice` (one option index per group), by layer.
Windows decided_windows(const Decisions& decisions, const std::vector<size_t>& choice);
// The windows the walk runs: the decided groups at their decided options.
inline Windows walk_windows(const Decisions& decisions) {
  return decided_windows(decisions, decisions.choice);
}

}  // namespace headwise::calib::seqcalib
