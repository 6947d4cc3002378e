#pragma once
// The calibration code path shared by the main command (`headwise-calc --model ...`) and
// `regen`: parse and validate the request, load the calibration data, hash every input, run
// SeqCalib (writing a resume checkpoint after each global layer when asked), and render the
// policy, report and heat map as text. Writing files is the caller's job, so `regen --check`
// can compare without writing and the main command can write everything or nothing.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "headwise/dist/collective.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::calib {

// Every option of the main command that shapes the policy, with its defaults and flag names.
struct CalibrationRequest {
  std::string model;
  std::string context;
  std::string budget;
  std::string windows = "1k,4k,16k,64k,full";
  std::string calib;  // empty: the built-in synthetic set
  int64_t samples = 8;
  std::string seq_len = "auto";  // auto: long enough to measure every finite ladder level
  // answer-tv-span: answer TV (what wins on retrieval accuracy, see AnswerDivergence) measured on the
  // answer span, at a cost flat in depth (answer_span.hpp); answer-tv is the exact measure.
  std::string distortion = "answer-tv-span";
  int64_t span_margin = 8;  // answer-span measures: tokens of the span before the first answer
  bool independent_heads = false;
  bool validate_measure = false;  // answer-grad / answer-*-span against the exact measure, in the report
  std::string extrapolate = "none";  // rule for levels the sequences cannot measure
  std::string keep_rules = "auto";  // window, window,h2o (heads may fill their slots with heavy hitters) or auto (keep_rules.hpp)
  int64_t prefill_chunk = 256;        // with h2o: the runtime's prefill chunk (H2O evicts after each)
  int64_t block_size = 16;
  int64_t batch = 1;
  int64_t sink_tokens = 0;
  std::string kv_dtype;
  // The dtype the serving cache keeps recurrent/conv states in (policy.yaml's state_dtype):
  // float32 by default, so the runtime decoder computes what calibration measured (the plain
  // forward) whatever the prefill chunking; native = each state's own dtype (policies made before
  // the option; no state_dtype field). See docs/memory.md.
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

struct RunControl {
  std::filesystem::path checkpoint;  // empty: none written
  bool resume = false;               // continue from `checkpoint` when it exists
  bool want_report = false;
  bool want_plot = false;
  // Distributed (docs/distributed.md): this process is one rank; every rank runs the same job,
  // rank 0 alone writes the checkpoint (and the caller the outputs). nullptr: one process.
  dist::Collective* collective = nullptr;
  int local_rank = 0;  // `--device cuda` becomes cuda:<local_rank>
};

struct CalibrationOutcome {
  policy::Policy policy;
  std::string policy_yaml;
  std::string report_json;  // when asked
  std::string svg;          // when asked
  double seconds = 0.0;
};

// `--seq-len auto`: the largest finite ladder level below the context plus a quarter (so about a
// fifth of the needles lie beyond it), rounded up to 1K tokens, at least 2K, at most the context.
int64_t auto_calibration_length(const std::vector<int64_t>& levels, int64_t context);

// A level w is measured when the sequences are longer than w (only then does any query lose a
// key to it). Levels at or above the context are full KV there. The others are an InputError
// naming --windows and --seq-len, unless `extrapolate` names a rule.
std::vector<int64_t> unmeasured_levels(const std::vector<int64_t>& levels, int64_t seq_len, int64_t context);

// `<output>.ckpt.json`: where a run writing `output` keeps its resume checkpoint.
std::filesystem::path checkpoint_path_for(const std::filesystem::path& output);

class CalibrationJob {
 public:
  // Validates the request and loads what is cheap (config, calibration data, fingerprints);
  // `output` is where the policy will live (its model_path is relative to it).
  CalibrationJob(const CalibrationRequest& request, const std::filesystem::path& output);
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
