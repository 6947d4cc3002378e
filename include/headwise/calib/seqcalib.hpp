#pragma once
// SeqCalib: walk the layers in execution order over the calibration batch; at each global
// layer measure every KV head's distortion at every window level *on the stream produced by
// the layers below running under their chosen windows*, choose the layer's windows with a
// Lagrangian controller that keeps (bytes spent + bytes planned for the layers ahead) within
// the budget, then run the layer under those windows for the next one. An exact knapsack
// completion spends what is left. See docs/seqcalib.md.
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/calib/answer_reference.hpp"
#include "headwise/calib/extrapolation.hpp"
#include "headwise/dist/collective.hpp"
#include "headwise/measure/distortion.hpp"
#include "headwise/measure/window_ladder.hpp"

namespace headwise::calib {

// Exact cache bytes of one KV head of `layer` at `window` (the memory model's rule).
using HeadBytesFn = std::function<int64_t(const arch::LayerSpec& layer, int64_t window)>;

enum class ActivationPlacement { kAuto, kDevice, kHost };

struct ResumeCheckpoint;  // resume_checkpoint.hpp: the resume checkpoint's contents
class AnswerSpan;         // answer_span.hpp

// The probe pass only steers the walk's Lagrangian controller (its curves price the layers not
// yet walked); the decisions come from the conditioned curves and the exact completion. Half the
// sequences (rounded up) steer it as well and keep a whole run under two plain forwards.
// The walk keeps copies of its stream entering global layers, up to this many bytes, so that a
// re-walk starts at the highest unchanged layer instead of the embeddings.
inline constexpr int64_t kStreamCheckpointLimitBytes = int64_t{1} << 30;

int64_t default_probe_samples(int64_t sequences);

// Sequences the probe pass uses: `requested` (clamped to what there is) or, when 0, the default.
int64_t effective_probe_samples(int64_t requested, int64_t sequences);

struct SeqCalibOptions {
  measure::WindowLadder ladder;
  int64_t global_budget_bytes = 0;  // budget left for global KV (total budget - fixed bytes)
  int64_t sink_tokens = 0;
  HeadBytesFn head_bytes;
  int64_t micro_batch = 1;  // sequences per layer call
  int64_t probe_samples =
      0;                    // sequences for the unconditioned probe pass; 0 = default_probe_samples
  bool conditioned = true;  // false: decide from probe curves only (the ablation baseline)
  DistortionMeasure measure = DistortionMeasure::kBlockMse;
  // answer-kl: per sequence, the positions whose next-token distribution is scored.
  std::vector<std::vector<int64_t>> answer_positions;
  // answer-kl: decide a layer's heads jointly (greedy descent on the layer's measured joint answer
  // KL); false: from per-head curves measured with the other heads at the top level (ablation).
  bool joint_heads = true;
  // answer-grad: also measure exactly (answer-kl) every probe (head, level) pair and each joint
  // layer decision, and report the prediction against it (SeqCalibResult::validation).
  bool validate_measure = false;
  // Ladder levels the calibration sequences cannot tell from full KV, and the rule that prices
  // them in every curve (calib/extrapolation.hpp).
  std::vector<int64_t> unmeasured_levels;
  Extrapolation extrapolation = Extrapolation::kNone;
  ActivationPlacement activations = ActivationPlacement::kAuto;
  // Resume: given, the probe is skipped and the layers up to resume->last_layer are replayed
  // under their recorded windows instead of measured. `checkpoint` receives the state after
  // each global layer, for writing the resume checkpoint.
  const ResumeCheckpoint* resume = nullptr;
  std::function<void(const ResumeCheckpoint& state)> checkpoint;
  // The answer-span measures: the measure (its reference forward done) on this rank's shard, shared
  // with the keep-rules pass that follows; nullptr: run_seqcalib makes its own.
  AnswerSpan* span = nullptr;
  // The answer-span measures: tokens of the span before the first answer position (the span's own
  // reference, when `span` is not given, is made with answer_span_options()).
  int64_t span_margin = 8;
  // The answer-span measures: whether the measured global layer's weights may stay resident beside
  // the layer streaming through its candidates' sweep (the memory plan's measured_layer_resident).
  // false: each global layer is captured, swept and then run under its decision in separate
  // passes, and its weights are loaded again for the last one.
  bool measured_layer_resident = true;
  // The span measures' cross-layer re-solve: true re-walks the layers above the lowest layer it
  // moves (each re-decided on the new stream, one more walk of them) and keeps the result when its
  // end-to-end divergence is lower; false (the default) checks the re-solved policy against the
  // walk's on the answer span (evaluate_policies: no stream beyond the checkpoint below it, no
  // re-decision), a cost that does not grow with the layers above.
  bool resolve_by_rewalk = false;
  // --decisions stable (issue 59): where the bootstrap over the sequences does not separate a
  // layer's measured assignments, the walk takes the first in a fixed order of preference
  // (seqcalib_decide.cpp) instead of the least measured value. Needs per-sequence values (the span
  // measures) and one process; otherwise the point decision.
  bool stable_decisions = false;
  // vLLM's tensor_parallel_size (issue 57): every decision of the run (each layer's, the
  // completion's, the re-solve's) keeps every rank's shard of a layer's KV heads at the same
  // multiset of windows (calib/walk/shard_constraint.hpp); 1: no constraint.
  int64_t tensor_parallel_size = 1;
  // Data parallel (dist/collective.hpp): this process measures its shard of the sequences (its
  // micro-batches, dist::shard_sequences) and combines every sum with the other ranks, so each
  // rank takes the decisions a single process would. nullptr: one process.
  dist::Collective* collective = nullptr;
};

struct HeadCurve {
  int64_t layer_id = 0;
  int64_t kv_head = 0;
  std::vector<int64_t> windows;    // one per ladder level
  std::vector<int64_t> bytes;      // exact bytes per level
  std::vector<double> distortion;  // measured per level
};

struct LayerReport {
  int64_t layer_id = 0;
  std::string kind;
  double seconds = 0.0;
  double lambda = 0.0;          // only for global layers
  int64_t bytes_spent = 0;      // global KV bytes decided for this layer before completion
  int64_t planned_ahead = 0;    // bytes the plan keeps for the layers above
  int64_t exchanged_bytes = 0;  // distributed: what this rank sent to the others for the layer
};

// One prediction of the answer-grad measure against the exact answer-kl measure of the same
// windows: a probe (head, level) pair (other heads at the top level, full KV below) or a layer's
// chosen joint windows on the conditioned stream (kv_head = -1). Both are the added mean answer
// KL over the layer at the top level.
struct MeasureCheck {
  int64_t layer_id = 0;
  int64_t kv_head = -1;
  std::vector<int64_t> windows;
  double predicted = 0.0;
  double measured = 0.0;
  // Joint decisions of the span measure: the exact measure's own decision on the same stream and
  // its exact added divergence (empty / NaN otherwise).
  std::vector<int64_t> exact_windows;
  double exact_measured = std::numeric_limits<double>::quiet_NaN();
};

struct MeasureValidation {
  std::vector<MeasureCheck> pairs;            // every probe (head, finite level)
  std::vector<MeasureCheck> joint_decisions;  // each walked layer's decision
  double spearman = 0.0;                      // over `pairs`; NaN when undefined
  double seconds = 0.0;                       // the exact measurements' time
};

// What a bootstrap says of one decision among measured candidates (noise/decision_noise.hpp): the
// chosen candidate's value and its interval, and its gap to the runner-up. The walk's decisions
// (DecisionNoise) and the keep rules' (KeepRuleNoise, keep_rules.hpp) each add what they chose.
struct DecisionGap {
  int64_t sequences = 0;                        // calibration sequences resampled
  int64_t replicates = 0;                       // bootstrap replicates
  double value = 0.0;                           // D(chosen), as measured
  double value_lower = 0.0, value_upper = 0.0;  // its 95% percentile interval
  int64_t alternatives = 0;                     // other measured candidates it was weighed against
  bool has_runner_up = false;                   // false when there is no alternative
  double runner_up_value = 0.0;                 // D(runner-up)
  double gap = 0.0;                             // J(runner-up) − J(chosen)
  double gap_lower = 0.0, gap_upper = 0.0;      // its 95% percentile interval
  double gap_sd = 0.0;                          // the replicates' standard deviation of the gap
  // The sequences a normal approximation says would separate this gap (N·(1.96·gap_sd/gap)², at
  // least N; NaN when the gap is not positive): what a sequential rule's cap must allow.
  double sequences_to_separate = 0.0;
  double gap_positive_share = 0.0;  // replicates in which the chosen one beats the runner-up
  double chosen_best_share = 0.0;   // replicates in which it beats every measured alternative
  bool separated = false;           // gap_lower > 0 (true when there is no alternative)
};

// How sure one global layer's walk decision is (issue 59; src/calib/noise/): a bootstrap over the
// calibration sequences of the values the decision measured. Only the answer-span measures keep the
// per-sequence values it needs, in one process.
//
// The decision trades the layer's measured joint value D against its bytes at the controller's
// price λ (the greedy descent cuts while a cut adds less than λ per byte saved, lengthens while a
// lengthening removes more than λ per byte spent): its objective is J(a) = D(a) + λ·bytes(a)
// within the layer's allowance. The runner-up is the assignment with the least J among every
// other assignment the decision measured that fits the allowance; the gap is J(runner-up) −
// J(chosen) (positive: the chosen one is better on the calibration sequences). Each bootstrap
// replicate recomputes D of every such assignment on the same resampled sequences.
struct DecisionNoise : DecisionGap {
  int64_t layer_id = 0;
  std::vector<int64_t> windows;  // the walk's decision (before the completion and any re-solve)
  double price = 0.0;            // λ
  int64_t allowance = 0;         // bytes the layer might spend
  std::vector<int64_t> runner_up_windows;  // empty when there is no alternative
};

struct SeqCalibResult {
  std::map<int64_t, std::vector<int64_t>> windows;  // global layer → window per KV head
  std::map<int64_t, std::vector<double>> expected_distortion;  // at the chosen windows
  std::vector<HeadCurve> curves;        // conditioned (what decided the policy)
  std::vector<HeadCurve> probe_curves;  // measured with full KV below
  double probe_lambda = 0.0;
  std::vector<LayerReport> layers;
  int64_t global_bytes = 0;  // after completion
  int64_t global_bytes_before_completion = 0;
  double total_distortion = 0.0;
  bool completion_proven_optimal = true;
  // answer-kl: end-to-end answer KL of the walk's decisions and of the completed policy, and how
  // many windows the completion moved (the conditioning of layers above saw the walk's).
  double divergence_walk = -1.0;
  double divergence_policy = -1.0;
  int64_t windows_moved_by_completion = 0;
  // Fresh conditioning: re-walks kept (the layers above the lowest one the completion moved,
  // re-decided on the completed stream), and the end-to-end answer KL of the first walk's policy
  // and of each re-walk tried (a last one not below its predecessor was discarded).
  int64_t rewalks = 0;
  std::vector<double> divergence_by_pass;
  // Cross-layer re-solve: passes kept (the exact solve over every layer's conditioned curves moved
  // a layer below a global layer; the layers above it re-walked), and the end-to-end answer KL on
  // entry and of each pass tried.
  int64_t resolves = 0;
  std::vector<double> divergence_by_resolve;
  // The span measures' re-solve checked on the answer span (SeqCalibOptions::resolve_by_rewalk
  // false): the span measure of the walk's completed policy and of the re-solved one, from the
  // lowest layer the re-solve moves (empty when it moved none).
  std::vector<double> span_by_resolve;
  int64_t answer_evaluations = 0;
  std::optional<MeasureValidation> validation;  // answer-grad with validate_measure
  // Per walked global layer, in layer order: how sure its decision is (DecisionNoise; empty for
  // measures without per-sequence values).
  std::vector<DecisionNoise> decision_noise;
  int64_t peak_device_bytes = 0;  // CUDA allocator peak, 0 on CPU
  int64_t peak_rss_bytes = 0;
  double probe_seconds = 0.0;
  double total_seconds = 0.0;
  std::string activations;      // "device" or "host"
  int64_t local_sequences = 0;  // this rank's shard (all of them in one process)
  int64_t exchanged_bytes = 0;  // distributed: everything this rank sent
};

// `sequences`: calibration token ids, all of the same length.
SeqCalibResult run_seqcalib(arch::DecoderModel& model,
                            const std::vector<std::vector<int64_t>>& sequences,
                            const SeqCalibOptions& options);

// The attention core used for deployment-like runs: global layers get their policy windows
// (physically as masks over the calibration stream), other layers run natively. It holds the
// windows it serves (a copy): what it computes cannot change behind it.
class PolicyAttentionCore final : public arch::AttentionCore {
 public:
  PolicyAttentionCore(std::map<int64_t, std::vector<int64_t>> windows, int64_t sink_tokens,
                      int64_t chunk)
      : windows_(std::move(windows)), sink_tokens_(sink_tokens), chunk_(chunk) {}
  at::Tensor attend(const arch::AttentionInputs& inputs) override;

 private:
  std::map<int64_t, std::vector<int64_t>> windows_;
  int64_t sink_tokens_;
  int64_t chunk_;
};

}  // namespace headwise::calib
