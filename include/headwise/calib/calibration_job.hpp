#pragma once
// The calibration code path shared by the main command (`headwise-calc --model ...`) and
// `regen`: validate the options, load the calibration data, hash every input, run SeqCalib
// (writing a resume checkpoint after each global layer when asked), and render the policy as
// text. Writing files is the caller's job, so `regen --check` can compare without writing and
// the main command can write everything or nothing; the report and heat map are rendered from
// the outcome by report/calib_report.hpp.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "headwise/arch/model_spec.hpp"
#include "headwise/calib/answer_reference.hpp"
#include "headwise/calib/extrapolation.hpp"
#include "headwise/calib/keep_rules.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/core/dtype.hpp"
#include "headwise/dist/collective.hpp"
#include "headwise/measure/window_ladder.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::calib {

// The main command's options as written on its command line or in a manifest entry (regen):
// text, with the command's defaults. cli/calibration_options.cpp turns it into
// CalibrationOptions, naming the flag at fault when a value does not parse.
struct CalibrationRequest {
  std::string model;
  std::string context;
  std::string budget;
  std::string windows = "1k,4k,16k,64k,full";
  std::string calib;  // empty: the built-in synthetic set
  int64_t samples = 8;
  std::string seq_len = "auto";  // auto: long enough to measure every finite ladder level
  std::string distortion = "answer-tv-span";
  int64_t span_margin = 8;
  bool resolve_by_rewalk = false;
  bool independent_heads = false;
  bool validate_measure = false;
  std::string extrapolate = "none";
  std::string keep_rules = "auto";
  int64_t prefill_chunk = 256;
  int64_t block_size = 16;
  int64_t batch = 1;
  int64_t sink_tokens = 0;
  std::string kv_dtype;
  std::string state_dtype = "float32";
  uint64_t seed = 0;
  std::string device = "cpu";
  std::string dtype;
  int64_t micro_batch = 0;
  int64_t probe_samples = 0;
  int64_t attention_chunk = 512;
  std::string activations = "auto";
  bool no_conditioning = false;
};

// Every option that shapes the policy, parsed. The job's errors name these members as fields
// (core/error.hpp: FieldError), which the CLI shows as its flags.
struct CalibrationOptions {
  std::string model;    // folder (config.json + safetensors) or cached HF repo id
  int64_t context = 0;  // tokens
  int64_t budget = 0;   // bytes, for the whole request batch
  measure::WindowLadder windows;
  std::string calib;  // empty: the built-in synthetic set
  int64_t samples = 8;
  std::optional<int64_t> seq_len;  // nullopt: auto_calibration_length
  // answer-tv-span: answer TV (what wins on retrieval accuracy, see AnswerDivergence) measured on
  // the answer span, at a cost flat in depth (answer_span.hpp); answer-tv is the exact measure.
  DistortionMeasure distortion = DistortionMeasure::kAnswerTvSpan;
  int64_t span_margin = 8;  // answer-span measures: tokens of the span before the first answer
  // answer-span measures: re-walk after the cross-layer re-solve
  // (SeqCalibOptions::resolve_by_rewalk).
  bool resolve_by_rewalk = false;
  bool independent_heads = false;
  // answer-grad / answer-*-span against the exact measure, in the report.
  bool validate_measure = false;
  // The rule for levels the sequences cannot measure.
  Extrapolation extrapolate = Extrapolation::kNone;
  // Resolved keep rules (keep_rules.hpp: resolve_keep_rules): true for window,h2o (heads may fill
  // their slots with heavy hitters), false for window.
  bool h2o_keep_rules = true;
  int64_t prefill_chunk = 256;  // with h2o: the runtime's prefill chunk (H2O evicts after each)
  int64_t block_size = 16;
  int64_t batch = 1;
  int64_t sink_tokens = 0;
  std::optional<DType> kv_dtype;  // nullopt: the checkpoint's
  // The dtype the serving cache keeps recurrent/conv states in (policy.yaml's state_dtype):
  // float32 by default, so the runtime decoder computes what calibration measured (the plain
  // forward) whatever the prefill chunking; nullopt (native) = each state's own dtype (policies
  // made before the option; no state_dtype field). See docs/memory.md.
  std::optional<DType> state_dtype = DType::kFloat32;
  uint64_t seed = 0;
  std::string device = "cpu";  // cpu, cuda or cuda:N (the model loader reads it)
  // Compute dtype as written (the inputs hash records this text); empty: the device's default.
  std::string dtype;
  int64_t micro_batch = 0;  // 0: every sequence at once (distributed: each rank's share)
  int64_t probe_samples = 0;
  int64_t attention_chunk = 512;
  ActivationPlacement activations = ActivationPlacement::kAuto;
  bool no_conditioning = false;
};

// "auto", "device", "host"; a FieldError naming `activations` otherwise.
ActivationPlacement parse_activation_placement(const std::string& text);

struct RunControl {
  std::filesystem::path checkpoint;  // empty: none written
  bool resume = false;               // continue from `checkpoint` when it exists
  // Distributed (docs/distributed.md): this process is one rank; every rank runs the same job,
  // rank 0 alone writes the checkpoint (and the caller the outputs). nullptr: one process.
  dist::Collective* collective = nullptr;
  int local_rank = 0;  // `--device cuda` becomes cuda:<local_rank>
};

// What a run measured and decided besides the policy: what the report and the heat map show.
struct CalibrationRecord {
  arch::ModelSpec spec;
  measure::WindowLadder ladder;
  int64_t context = 0;
  int64_t budget_bytes = 0;
  int64_t fixed_bytes = 0;
  SeqCalibResult result;
  std::optional<KeepRuleResult> keep_rules;  // when heads could choose h2o
  // MemoryPlan::to_json() plus "rss_before_model_bytes".
  nlohmann::json memory_plan;
  int world_size = 1;
  std::string backend;
  int64_t micro_batch = 0;
};

struct CalibrationOutcome {
  policy::Policy policy;
  std::string policy_yaml;
  CalibrationRecord record;
  double seconds = 0.0;
};

// seq_len auto: the largest finite ladder level below the context plus a quarter (so about a
// fifth of the needles lie beyond it), rounded up to 1K tokens, at least 2K, at most the context.
int64_t auto_calibration_length(const std::vector<int64_t>& levels, int64_t context);

// A level w is measured when the sequences are longer than w (only then does any query lose a
// key to it). Levels at or above the context are full KV there. The others are a FieldError
// naming the windows and seq_len fields, unless `extrapolate` names a rule.
std::vector<int64_t> unmeasured_levels(const std::vector<int64_t>& levels, int64_t seq_len,
                                       int64_t context);

// `<output>.ckpt.json`: where a run writing `output` keeps its resume checkpoint.
std::filesystem::path checkpoint_path_for(const std::filesystem::path& output);

class CalibrationJob {
 public:
  // Validates the options and loads what is cheap (config, calibration data, fingerprints);
  // `output` is where the policy will live (its model_path is relative to it).
  CalibrationJob(const CalibrationOptions& options, const std::filesystem::path& output);
  ~CalibrationJob();
  CalibrationJob(const CalibrationJob&) = delete;
  CalibrationJob& operator=(const CalibrationJob&) = delete;

  // sha256 of the model fingerprint, calibration data hash, every option that shapes the
  // policy and the tool version; recorded in the policy's provenance as `inputs_sha256`.
  const std::string& inputs_hash() const;
  // Loads the weights and runs the calibration.
  CalibrationOutcome run(const RunControl& control);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace headwise::calib
