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
#include "headwise/calib/calibration_options.hpp"
#include "headwise/calib/extrapolation.hpp"
#include "headwise/calib/keep_rules.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/calib/tensor_parallel.hpp"
#include "headwise/core/dtype.hpp"
#include "headwise/dist/collective.hpp"
#include "headwise/measure/window_ladder.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::calib {

struct RunControl {
  std::filesystem::path checkpoint;  // empty: none written
  bool resume = false;               // continue from `checkpoint` when it exists
  // Distributed (docs/distributed.md): this process is one rank; every rank runs the same job,
  // rank 0 alone writes the checkpoint (and the caller the outputs). nullptr: one process.
  dist::Collective* collective = nullptr;
  int local_rank = 0;  // `--device cuda` becomes cuda:<local_rank>
};

// --engine vllm: the walk's completed windows fitted to vLLM's exact reservation
// (calib/engine.hpp). The report's windows, bytes and total_distortion are the fitted policy's;
// this says what the fit moved.
struct EngineFitRecord {
  int64_t heads_moved = 0;
  int64_t total_bytes = 0;       // vLLM's reservation for the fitted policy
  double walk_distortion = 0.0;  // the completion's total distortion, before the fit
  double distortion = 0.0;       // the fitted windows' (the report's total_distortion)
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
  std::optional<TensorParallelFit> tensor_parallel;  // --tensor-parallel-size above 1
  std::optional<EngineFitRecord> engine_fit;         // --engine vllm
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

// The calibration's revisions that inputs_sha256 covers, for `resolved` options: bumped whenever
// the same inputs can give another policy, so that a plain `regen` recalibrates what an older
// calibration wrote instead of skipping it as unchanged. `calibration_revision` for every run;
// `tensor_parallel_revision` only for --tensor-parallel-size above 1 and
// `stable_decisions_revision` only for --decisions stable (each changed on its own, and every
// other policy keeps its hash).
nlohmann::json calibration_revisions(const CalibrationOptions& resolved);

// `<output>.ckpt.json`: where a run writing `output` keeps its resume checkpoint.
std::filesystem::path checkpoint_path_for(const std::filesystem::path& output);

class CalibrationJob {
 public:
  // Validates the options and loads what is cheap (config, calibration data, fingerprints), and
  // resolves what the options leave to it (seq_len auto, the checkpoint's kv_dtype, keep rules
  // auto, samples as many as the data holds): the hash, the provenance and the run read those.
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

  struct State;  // the resolved options and what the constructor loaded (calibration_job.cpp)

 private:
  std::unique_ptr<State> state_;
};

}  // namespace headwise::calib
